//! The validated pipeline: what the rest of cairn works from.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::raw::Span;

/// A pipeline manifest that passed validation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// The manifest file, as given on the command line.
    pub path: PathBuf,
    /// The manifest text, kept so that later layers can point at it.
    pub source: String,
    pub name: String,
    /// Absolute project root; commands run here and paths resolve against it.
    pub root: PathBuf,
    /// `[pipeline] root` as written (`None`: the manifest's directory),
    /// resolved again when a kept manifest is taken up.
    pub root_as_written: Option<String>,
    pub profile: Option<String>,
    /// Param values after the profile's overrides.
    #[serde(with = "super::serde_as::json_map")]
    pub params: BTreeMap<String, serde_json::Value>,
    /// `[resources]`: name → capacity and how it is held.
    pub resources: BTreeMap<String, Resource>,
    /// `[executors]`: name → where the commands of stages that name it run
    /// (after the profile's replacements).
    pub executors: BTreeMap<String, ExecutorSpec>,
    /// `[cache.remote]`: a cache shared across machines.
    pub remote_cache: Option<RemoteCacheSpec>,
    /// `[cache] link`: how stored files and workspace copies share the disk.
    pub link: Link,
    /// `[services]`: name → a server stages reach while they run (after
    /// the profile's replacements).
    pub services: BTreeMap<String, Service>,
    /// Stages in document order.
    pub stages: Vec<Stage>,
}

/// `[services.NAME]`: a server the stages that name it reach while they
/// run (a model server), started by cairn for them or reached where it
/// already runs. A service is reached, not fingerprinted: what it serves
/// is declared as content, and `check` verifies it each time it comes up.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Service {
    pub name: String,
    pub description: Option<String>,
    /// The command that serves it (`{service.port}` is a free port cairn
    /// picks); `None` for a service that already runs at `url`.
    pub run: Option<Command>,
    /// Where the stages reach it (`{service.port}` filled in).
    pub url: String,
    /// The variable the stages' commands find `url` in.
    pub env: String,
    /// Polled (under `url`) until it answers 2xx: the service is up.
    pub ready: String,
    /// Run once it is up, with `env` set; must exit 0 before any stage
    /// uses the service (the served model and its checksums verified).
    pub check: Option<Command>,
    /// Variables passed through from cairn's environment to `run` and
    /// `check` (an API key), whose values are redacted from its log.
    pub secrets: Vec<String>,
    /// How long it may take to come up (and `check` to pass).
    pub start_timeout: Duration,
    /// One server per group of its stages' `isolate` groups, one at a
    /// time (`{service.group}` names the group): each model of a canary on
    /// its own server.
    pub per_group: bool,
    /// The GPUs this machine must have free before cairn starts it.
    pub gpus: Option<GpuNeed>,
}

/// `gpus = { count = 2, memory_gib = 40 }`: at least `count` GPUs with at
/// least `memory_gib` GiB free each, by `nvidia-smi`, before the server is
/// started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuNeed {
    pub count: u32,
    pub memory_gib: u32,
}

/// `[cache] link`: how a stored file and its workspace copy share the disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Link {
    /// Two copies.
    #[default]
    Copy,
    /// One set of blocks, copied on write, where the file system can.
    Reflink,
    /// One inode, made read-only.
    Hardlink,
}

/// `[cache.remote]`, as written (keys are parsed where they are used).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteCacheSpec {
    pub url: String,
    /// Public keys (`ed25519:BASE64`) trusted besides this machine's own.
    pub trust: Vec<String>,
    /// The environment variable holding the `Authorization` header value.
    pub auth: Option<String>,
    /// The signing key's file, if not the default.
    pub key: Option<String>,
    /// Whether results made here are uploaded.
    pub upload: bool,
    /// How long one request may take.
    pub timeout: std::time::Duration,
}

impl RemoteCacheSpec {
    /// How long a request may take when the manifest does not say.
    pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

    /// A cache at `url` with every other setting at its default.
    pub fn at(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            trust: Vec::new(),
            auth: None,
            key: None,
            upload: true,
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }
}

impl Manifest {
    /// The image `stage`'s commands run in, as written (it may hold
    /// `{item.FIELD}`), and whether it must be given by digest; `None` for
    /// an executor that runs no images.
    pub fn image_of(&self, stage: &Stage) -> Option<(&str, bool)> {
        match self.executors.get(&stage.executor.as_ref()?.name)? {
            ExecutorSpec::Kubernetes(settings) => {
                Some((settings.image.as_str(), settings.require_digest))
            }
            ExecutorSpec::Local | ExecutorSpec::Slurm(_) => None,
        }
    }
}

/// Whether an executor's `image` is filled from each item's fields
/// (`{item.FIELD}`).
pub fn is_per_item(image: &str) -> bool {
    let mut per_item = false;
    let _ = super::interpolate::walk(image, false, |p| {
        per_item |= p.namespace == "item";
        Ok::<_, ()>(None)
    });
    per_item
}

/// `[executors.NAME]`: an engine that runs stages' commands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecutorSpec {
    /// Processes on this machine (what a stage without `executor` uses).
    Local,
    /// Batch jobs on a Slurm cluster.
    Slurm(SlurmSettings),
    /// Kubernetes Jobs, one pod each, in a cluster.
    Kubernetes(KubernetesSettings),
}

impl ExecutorSpec {
    pub fn kind(&self) -> &'static str {
        match self {
            ExecutorSpec::Local => "local",
            ExecutorSpec::Slurm(_) => "slurm",
            ExecutorSpec::Kubernetes(_) => "kubernetes",
        }
    }
}

/// Where and how a stage's jobs run on Slurm.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmSettings {
    pub partition: Option<String>,
    pub account: Option<String>,
    /// `--time`, in whole minutes (at least 1), unless the stage's own
    /// `timeout` is set.
    pub time_limit: Option<Duration>,
    pub cpus: Option<u32>,
    /// `--mem`, as Slurm reads it (`4G`, `500M`).
    pub memory: Option<String>,
    /// `--gres`, e.g. `gpu:1`.
    pub gres: Option<String>,
    /// Further `sbatch` arguments, passed as they are.
    pub sbatch_args: Vec<String>,
    /// The longest wait between two state queries.
    pub poll: Duration,
    /// At most this many of its jobs queued or running at once.
    pub max_jobs: usize,
    /// Items that share everything but their command go in job arrays of
    /// at most this many tasks (1: one job per item).
    pub batch: usize,
}

/// Where and how a stage's jobs run on Kubernetes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesSettings {
    pub namespace: String,
    /// The container image, `REPO@sha256:…` unless `require_digest` is off;
    /// `{item.FIELD}` fills it from each item (see [`Manifest::image_of`]).
    pub image: String,
    /// A tag is refused (true) or resolved to a digest through its
    /// registry before fingerprinting (false).
    pub require_digest: bool,
    pub service_account: Option<String>,
    /// Requests and limits, as Kubernetes quantities (`500m`, `2`, `4Gi`).
    pub cpu: Option<String>,
    pub memory: Option<String>,
    /// `nvidia.com/gpu` requested and limited.
    pub gpus: Option<u32>,
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    pub image_pull_secrets: Vec<String>,
    /// The Kubernetes Secret holding the stage's `secrets`, one key per
    /// variable name; without it a job gets no secret.
    pub secret: Option<String>,
    /// How the project root reaches the pod, mounted at the same path.
    pub root_volume: RootVolume,
    /// A pod that no node can take for this long fails as infrastructure.
    pub unschedulable_timeout: Duration,
    /// `ttlSecondsAfterFinished`: how long a finished Job stays for `kubectl`.
    pub ttl: Duration,
    /// At most this many of its Jobs (or indices of Indexed Jobs) exist
    /// unfinished at once.
    pub max_jobs: usize,
    /// Items that share everything but their command go in Indexed Jobs of
    /// at most this many completions (1: one Job per item).
    pub batch: usize,
    /// At most this many API requests a second from this executor (a
    /// watch counts once, when it starts); `None`: no client-side limit.
    pub qps: Option<u32>,
}

/// How the project root is mounted into a pod (at the same path).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RootVolume {
    /// A PersistentVolumeClaim, by name, that holds the root.
    Claim(String),
    /// The node's own directory of that path (single-node kind/k3s, or a
    /// network filesystem every node mounts there).
    #[default]
    HostPath,
}

/// One toleration of node taints, as Kubernetes spells it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Toleration {
    pub key: Option<String>,
    /// `Equal` or `Exists`.
    pub operator: Option<String>,
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: Option<String>,
}

/// A named capacity (`[resources]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resource {
    pub capacity: u32,
    /// Held by a per-item stage as a whole while it runs (its items run
    /// concurrently inside), instead of by each item's command.
    pub per_stage: bool,
    /// `across = "EXECUTOR"`: also held across every cairn process that
    /// uses that executor's cluster, where its engine can (a Kubernetes
    /// Lease); elsewhere within this process only.
    pub across: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stage {
    pub name: String,
    /// Where `[stages.NAME]` is written, for errors about the whole stage.
    pub span: Span,
    pub description: Option<String>,
    /// The command; for a built-in stage, `cairn builtin NAME@VERSION SPEC`
    /// (the executor puts the running cairn binary in place of `cairn`).
    pub run: Command,
    /// Set for a built-in stage (`uses = "NAME"`).
    pub uses: Option<Uses>,
    pub inputs: Vec<PathDecl>,
    pub outputs: Vec<PathDecl>,
    pub needs: Vec<Named>,
    /// The params that enter the fingerprint, with their values.
    #[serde(with = "super::serde_as::json_map")]
    pub params: BTreeMap<String, serde_json::Value>,
    pub env: BTreeMap<String, EnvValue>,
    /// Variables passed through from cairn's environment whose values are
    /// never recorded, logged or hashed (API tokens); a command's log has
    /// their values redacted.
    pub secrets: Vec<String>,
    pub version: Option<String>,
    pub checks: Vec<Command>,
    pub timeout: Option<Duration>,
    /// Named resources held while the command and checks run.
    pub resources: Vec<Named>,
    /// `executor = "NAME"`: the `[executors]` entry its commands run on;
    /// `None` runs them on this machine.
    pub executor: Option<Named>,
    /// `services = ["NAME", …]`: the `[services]` its commands reach, up
    /// before the first command runs.
    pub services: Vec<Named>,
    /// How each attempt (of the command, or of an item's) is classed.
    pub classify: Vec<ClassifyRule>,
    /// Which classes are attempted again, how often.
    pub retry: Retry,
    /// Set for a per-item stage: its command runs once per item.
    pub foreach: Option<Foreach>,
}

impl Stage {
    /// The `[executors]` entry its commands run on, else `local`.
    pub fn executor_name(&self) -> String {
        self.executor
            .as_ref()
            .map_or_else(|| "local".to_owned(), |e| e.name.clone())
    }

    /// What the stage runs, as one line: its command, or for a built-in
    /// `uses NAME@VERSION with {SETTINGS}`.
    pub fn describe_run(&self) -> String {
        match &self.uses {
            Some(uses) => format!("uses {}@{} with {}", uses.name, uses.version, uses.with),
            None => self.run.display(),
        }
    }
}

/// A built-in stage's name, version and settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Uses {
    pub name: String,
    pub version: u32,
    /// The `with` table after interpolation.
    #[serde(with = "super::serde_as::json")]
    pub with: serde_json::Value,
}

/// A per-item stage's settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Foreach {
    /// The JSON array or JSONL file listing the items.
    pub items: ProjectPath,
    pub items_span: Span,
    /// The field that names an item (unique).
    pub key: String,
    /// Paths each item reads, with `{item.FIELD}` placeholders.
    pub item_inputs: Vec<String>,
    /// Entries the items write inside the stage's directory outputs.
    pub item_outputs: Vec<ItemOutput>,
    /// How many items may end in `error` before the stage fails.
    pub allow_errors: usize,
    /// At most this many items of the stage run at once.
    pub jobs: Option<usize>,
    /// The JSON file each item's command writes (with `{item.FIELD}`
    /// placeholders): read after each attempt, kept with the outcome, and
    /// open to `classify` rules and checks.
    pub result: Option<String>,
    /// Checks over that JSON result.
    pub result_checks: Vec<ResultCheck>,
    /// The agent trajectory each item's command writes (with `{item.FIELD}`
    /// and `{sample.index}` placeholders), read by cairn after each
    /// attempt: what it says is recorded with the result (`/trajectory`),
    /// and an attempt whose trajectory holds no model turn is never a pass
    /// (see [`crate::trajectory`]).
    pub trajectory: Option<String>,
    /// Set for a sampled stage: each item runs `k` times, each sample its
    /// own unit.
    pub samples: Option<Samples>,
    /// Set when groups of items stand or fall on their own smoke items.
    pub isolate: Option<Isolate>,
}

impl Foreach {
    /// Whether an item's outcome of `class` is kept: reused by later runs
    /// and never tried again unless asked (`--only error`, `--force`).
    /// Final classes are; so is an error of a sampled stage whose errors
    /// count as fails (see [`Foreach::keeps_errors`]).
    pub fn keeps(&self, class: &ItemClass) -> bool {
        class.is_kept(self.keeps_errors())
    }

    /// A sample in error counts as a fail (`samples.errors = "fail"`, the
    /// default): it is a drawn outcome, and drawing it again until it is
    /// not an error would bias the figure, so it is kept as it ended.
    pub fn keeps_errors(&self) -> bool {
        self.samples
            .as_ref()
            .is_some_and(|s| s.errors == ErrorsCount::AsFails)
    }
}

/// `isolate = { by = "model", smoke = "smoke", mark = "harness-incompatible" }`:
/// items are grouped by the field `by`; the items whose field `smoke` is
/// true run first, and a group whose smoke item ends in `error` (or still
/// on infrastructure) is marked and its other items skipped, while the
/// other groups go on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Isolate {
    pub by: String,
    pub smoke: String,
    /// What a skipped item of a marked group is reported as.
    pub mark: String,
    /// Groups run one after another (in the order of their names), each
    /// its smoke items first: one model served at a time.
    pub one_at_a_time: bool,
    /// At most this many items of one group at once (a model server's
    /// concurrency), within the stage's `jobs`.
    pub jobs: Option<usize>,
}

/// `samples = { k, seed, pass_at, split, errors }`: a per-item stage whose
/// command is a draw, not a function. Each (item, sample) is its own unit,
/// with its own fingerprint, attempts and outcome; `ok` is a pass, a
/// verdict a valid fail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Samples {
    /// Samples per item.
    pub k: u32,
    /// The base seed: sample `s` of every item is drawn with `seed + s`.
    pub seed: u64,
    /// The `k` of each pass@k reported (1 and `k` unless given).
    pub pass_at: Vec<u32>,
    /// The item field naming the sub-list an item belongs to (e.g.
    /// `split` = `train` | `validation`), reported apart.
    pub split: Option<String>,
    /// The item field naming the evaluation protocol an item was run
    /// under (e.g. `profile` = `official-32k`): every figure is made per
    /// protocol, none over two (no pooled total, no comparison across).
    pub protocol: Option<String>,
    /// Whether samples that ended in error count as fails (the default)
    /// or leave the denominator.
    pub errors: ErrorsCount,
    /// The output the stage's summary (JSON: pass@k per stage and
    /// sub-list, groups, denominators) is written to, if any.
    pub summary: Option<String>,
    /// Groups compared pairwise on the same items, in the summary.
    pub compare: Option<Compare>,
}

/// `compare = { by = "model", on = "task_id" }`: the items of each pair of
/// groups (values of `by`) are paired by `on`, and their pass rates
/// compared: the mean difference with a paired bootstrap interval, and
/// McNemar's exact test when each item has one sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compare {
    pub by: String,
    pub on: String,
}

impl Samples {
    /// `k = 8, seed = 0, pass_at = [1, 8], errors = fail` (and the split).
    pub fn describe(&self) -> String {
        let at: Vec<String> = self.pass_at.iter().map(u32::to_string).collect();
        let mut text = format!(
            "k = {}, seed = {}, pass_at = [{}], errors = {}",
            self.k,
            self.seed,
            at.join(", "),
            self.errors.name()
        );
        if let Some(split) = &self.split {
            text.push_str(&format!(", split = {split}"));
        }
        if let Some(protocol) = &self.protocol {
            text.push_str(&format!(", protocol = {protocol}"));
        }
        if let Some(summary) = &self.summary {
            text.push_str(&format!(", summary = {summary}"));
        }
        if let Some(compare) = &self.compare {
            text.push_str(&format!(", compare = {} on {}", compare.by, compare.on));
        }
        text
    }
}

/// How samples that ended in `error` enter pass rates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorsCount {
    /// As fails: the denominator is every sample requested.
    AsFails,
    /// Not at all: the denominator is the valid samples (reported as such).
    Excluded,
}

impl ErrorsCount {
    pub fn name(self) -> &'static str {
        match self {
            ErrorsCount::AsFails => "fail",
            ErrorsCount::Excluded => "exclude",
        }
    }
}

/// What each item writes inside one of the stage's directory outputs:
/// `OUTPUT/TEMPLATE`, the template naming the item (`{item.id}`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ItemOutput {
    /// The declared output (a directory) the entry lies in.
    pub output: String,
    /// One path component with `{item.FIELD}` placeholders.
    pub template: String,
    pub span: Span,
}

/// A predicate over an item's JSON result, at a JSON pointer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResultCheck {
    pub pointer: String,
    pub expect: Expect,
    /// The check as written, for records.
    pub text: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Expect {
    /// The value equals this one.
    Equals(#[serde(with = "super::serde_as::json")] serde_json::Value),
    /// A number at least this large, or a string, array or object with at
    /// least this many elements.
    Min(f64),
    /// The pointer resolves (or, with `false`, does not).
    Exists(bool),
}

impl ResultCheck {
    /// Whether `result` passes.
    pub fn holds(&self, result: &serde_json::Value) -> bool {
        let value = result.pointer(&self.pointer);
        match (&self.expect, value) {
            (Expect::Exists(wanted), value) => value.is_some() == *wanted,
            (Expect::Equals(wanted), Some(value)) => value == wanted,
            (Expect::Min(min), Some(serde_json::Value::Number(n))) => {
                n.as_f64().is_some_and(|n| n >= *min)
            }
            (Expect::Min(min), Some(serde_json::Value::String(s))) => {
                s.chars().count() as f64 >= *min
            }
            (Expect::Min(min), Some(serde_json::Value::Array(a))) => a.len() as f64 >= *min,
            (Expect::Min(min), Some(serde_json::Value::Object(o))) => o.len() as f64 >= *min,
            _ => false,
        }
    }
}

/// How an item's attempt ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ItemClass {
    Ok,
    /// A final result other than ok (`rejected`, `gold-fails`, …).
    Verdict(String),
    /// The infrastructure failed; retried, never a verdict.
    Infra,
    Error,
}

impl ItemClass {
    pub fn parse(name: &str) -> Self {
        match name {
            "ok" => ItemClass::Ok,
            "infra" => ItemClass::Infra,
            "error" => ItemClass::Error,
            other => ItemClass::Verdict(other.to_owned()),
        }
    }

    pub fn name(&self) -> &str {
        match self {
            ItemClass::Ok => "ok",
            ItemClass::Verdict(name) => name,
            ItemClass::Infra => "infra",
            ItemClass::Error => "error",
        }
    }

    /// Ok and verdicts are final: reused by later runs, never retried.
    pub fn is_final(&self) -> bool {
        matches!(self, ItemClass::Ok | ItemClass::Verdict(_))
    }

    /// Whether an outcome of this class is kept (reused, never tried
    /// again unless asked): a final one, or an error where errors are
    /// kept (see [`Foreach::keeps_errors`]).
    pub fn is_kept(&self, errors_kept: bool) -> bool {
        self.is_final() || (errors_kept && *self == ItemClass::Error)
    }
}

/// `{ exit = 75, output = "regex", as = "infra" }`: every condition given
/// must hold.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClassifyRule {
    pub exit: Vec<i32>,
    /// An end without an exit code that the rule claims: a timeout, or a
    /// job an engine killed for its memory.
    pub ended: Option<Ended>,
    #[serde(with = "super::serde_as::regex")]
    pub output: Option<regex::Regex>,
    /// A condition on the item's JSON result.
    pub result: Option<ResultCheck>,
    pub class: ItemClass,
    /// The rule as written, for records.
    pub text: String,
}

/// The ends without an exit code that `classify` can name (`ended =
/// "timeout"`): each has a default class (error, infra) that a rule may
/// change, as a model that leaks memory until it is killed may be a
/// verdict rather than a fault of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ended {
    /// Ran past its time limit (the stage's `timeout`, Slurm's TIMEOUT).
    Timeout,
    /// Killed for its memory (Kubernetes' OOMKilled, Slurm's
    /// OUT_OF_MEMORY).
    OutOfMemory,
}

impl Ended {
    pub const NAMES: &[&str] = &["timeout", "out-of-memory"];

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "timeout" => Some(Ended::Timeout),
            "out-of-memory" => Some(Ended::OutOfMemory),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Retry {
    pub max: u32,
    pub on: Vec<ItemClass>,
    pub backoff: Duration,
}

impl Retry {
    /// How long to wait after failed attempt `attempt` (from 1): the
    /// backoff, doubled for each attempt before it.
    pub fn backoff_before(&self, attempt: u32) -> Duration {
        self.backoff
            .saturating_mul(1 << attempt.saturating_sub(1).min(16))
    }
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            max: 0,
            on: vec![ItemClass::Infra],
            backoff: Duration::ZERO,
        }
    }
}

/// A name written in the manifest, with where it was written.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Named {
    pub name: String,
    pub span: Span,
}

/// A command after interpolation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Run through `/bin/sh -c`.
    Shell(String),
    /// Executed directly, without a shell.
    Exec(Vec<String>),
}

impl Command {
    /// The command as one line, for display and hashing.
    pub fn display(&self) -> String {
        match self {
            Command::Shell(script) => script.clone(),
            Command::Exec(argv) => format!("{argv:?}"),
        }
    }
}

/// A declared input or output.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PathDecl {
    /// The table key, or the position in a list ("0", "1", …).
    pub name: String,
    pub path: ProjectPath,
    pub span: Span,
    /// An input fetched by URL (`{ url = …, sha256 = … }`): `path` is
    /// where cairn keeps what it fetched ([`Pin::path`]).
    #[serde(default)]
    pub pinned: Option<Pin>,
}

/// An input cairn fetches: a URL, and the SHA-256 its bytes must have.
/// Fetched once, verified, and kept; every later run, and a machine with
/// no network, reads the copy kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pin {
    pub url: String,
    /// Lowercase hex, 64 digits.
    pub sha256: String,
}

impl Pin {
    /// Where the fetched bytes are kept, from the project root:
    /// `cache/fetched/sha256/HEX/NAME`, NAME the URL's last path segment
    /// (`download` if it has none), so a command sees the file's own name.
    pub fn path(&self) -> ProjectPath {
        let last = self
            .url
            .split(['?', '#'])
            .next()
            .and_then(|url| url.rsplit('/').next())
            .filter(|name| {
                !name.is_empty()
                    && *name != "."
                    && *name != ".."
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._-+~".contains(c))
            })
            .unwrap_or("download");
        ProjectPath::new(format!("cache/fetched/sha256/{}/{last}", self.sha256))
    }
}

/// A path relative to the project root (`/`-separated, normalised); inputs
/// may also lie outside it: relative, leading `..` kept (`../shared/x`,
/// portable with the project), or absolute as written.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProjectPath(String);

impl ProjectPath {
    pub fn new(normalised: String) -> Self {
        Self(normalised)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Outside the project root (`../…` or absolute).
    pub fn is_external(&self) -> bool {
        self.0.starts_with('/') || self.0 == ".." || self.0.starts_with("../")
    }

    /// The path on disk (an absolute path is kept as it is).
    pub fn resolve(&self, root: &Path) -> PathBuf {
        root.join(&self.0)
    }

    /// This path and every ancestor inside the project, nearest first.
    pub fn self_and_ancestors(&self) -> impl Iterator<Item = &str> {
        let s = self.0.as_str();
        std::iter::once(s).chain(
            s.char_indices()
                .rev()
                .filter(|&(i, c)| c == '/' && i > 0)
                .map(|(i, _c)| &s[..i]),
        )
    }
}

impl std::fmt::Display for ProjectPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EnvValue {
    /// A value written in the manifest.
    Literal(String),
    /// Taken from cairn's own environment.
    PassThrough,
}

impl Manifest {
    pub fn stage(&self, name: &str) -> Option<&Stage> {
        self.stages.iter().find(|stage| stage.name == name)
    }

    /// The directory that holds cairn's state for this project.
    pub fn cache_dir(&self) -> PathBuf {
        self.root.join("cache")
    }

    /// `<manifest-stem>.lock` beside the manifest.
    pub fn lock_path(&self) -> PathBuf {
        lock_path_of(&self.path)
    }
}

/// The lock file of the manifest at `manifest`: `<stem>.lock` beside it.
pub fn lock_path_of(manifest: &Path) -> PathBuf {
    let stem = manifest
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "cairn".to_owned());
    manifest.with_file_name(format!("{stem}.lock"))
}

/// Which stage writes which path: `(stage index, output index)` by path.
#[derive(Debug, Default)]
pub struct OutputIndex {
    by_path: HashMap<String, (usize, usize), foldhash::fast::RandomState>,
}

impl OutputIndex {
    /// Indexes every output; the first writer of a path wins (duplicates are
    /// reported by validation).
    pub fn new(stages: &[Stage]) -> Self {
        let outputs = stages.iter().map(|stage| stage.outputs.len()).sum();
        let mut by_path = HashMap::with_capacity_and_hasher(outputs, Default::default());
        for (s, stage) in stages.iter().enumerate() {
            for (o, output) in stage.outputs.iter().enumerate() {
                by_path
                    .entry(output.path.as_str().to_owned())
                    .or_insert((s, o));
            }
        }
        Self { by_path }
    }

    /// The output that is `path` or a directory containing it.
    pub fn producer_of(&self, path: &ProjectPath) -> Option<(usize, usize)> {
        path.self_and_ancestors()
            .find_map(|candidate| self.by_path.get(candidate).copied())
    }
}
