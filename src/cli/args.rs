//! Command-line arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "cairn",
    version,
    about = "A declarative pipeline engine: reruns only what changed, keeps every validated result, and can explain itself."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct Global {
    /// The pipeline manifest (default: `cairn.toml` in the current
    /// directory or the nearest parent that has one).
    #[arg(short = 'f', long = "file", global = true, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Apply `[profiles.NAME]` (its params and executors); `A,B` applies
    /// both in turn, the later winning where they overlap.
    #[arg(long, global = true, value_name = "NAME[,NAME…]")]
    pub profile: Option<String>,
    /// More log output (-v info, -vv debug); `RUST_LOG` also works.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only errors on stderr: no progress, no per-stage lines.
    #[arg(short, long, global = true)]
    pub quiet: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Bring the targets (default: every stage) up to date.
    Run(RunArgs),
    /// List each stage: fresh, stale (with the reason), never run or failed.
    Status(StatusArgs),
    /// Explain why a stage would run: the components that changed, old → new.
    Why(WhyArgs),
    /// Print the stage graph.
    Dag(DagArgs),
    /// Run history, one run's timeline, or the attempts of one stage.
    Log(LogArgs),
    /// A run's report: one self-contained HTML page (or its data as JSON).
    Report(ReportArgs),
    /// A stage's command, outputs with digests, and last run.
    Show(ShowArgs),
    /// Remove stored objects that no current result references.
    Gc(GcArgs),
    /// Draw samples of a sampled stage anew in the next run (recorded: a
    /// re-draw is an act, never a side effect of a retry).
    Resample(ResampleArgs),
    /// Take outcomes made before cairn (a JSONL file, one item a line)
    /// into a per-item stage, reused while the items are unchanged.
    Import(ImportArgs),
    /// Upload the current results of the targets (and their items) to the
    /// remote cache.
    Push(TransferArgs),
    /// Bring the results the lock file names from the remote cache: record
    /// them, restore their outputs, run nothing.
    Pull(TransferArgs),
    /// This machine's public key (made on first use), for teammates'
    /// `[cache.remote] trust`.
    Key(KeyArgs),
    /// Re-hash every output and stored object the records vouch for.
    Audit(AuditArgs),
    /// The chain of recorded results behind an output or stage.
    Provenance(ProvenanceArgs),
    /// Check a bundle: its digest, every entry, every file, the freeze's
    /// split IDs, counts and digests. Writes nothing.
    Verify(VerifyArgs),
    /// Verify a bundle, then import it into a registry directory.
    Register(RegisterArgs),
    /// Run a built-in stage (what `uses = "NAME"` stages run).
    #[command(hide = true)]
    Builtin(BuiltinArgs),
}

/// What `verify` and `register` read: a bundle, its pin and the limits.
#[derive(Debug, Args)]
pub struct BundleArgs {
    /// The bundle (`.tar.zst`) written by `uses = "export"`.
    pub bundle: PathBuf,
    /// The SHA-256 the archive must have (default: from `BUNDLE.sha256`
    /// beside it; `register` needs one of the two).
    #[arg(long, value_name = "HEX")]
    pub sha256: Option<String>,
    /// Refuse a bundle holding a file larger than this (e.g. 512MiB).
    #[arg(long, value_name = "SIZE", default_value = "64GiB", value_parser = parse_size)]
    pub max_file_size: u64,
    /// Refuse a bundle that unpacks to more than this.
    #[arg(long, value_name = "SIZE", default_value = "1TiB", value_parser = parse_size)]
    pub max_total_size: u64,
    /// Machine-readable report on stdout: one JSON object (keys in
    /// docs/releases.md, "`--json`").
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Instead of a bundle, re-hash the workspace's outputs against a lock
    /// file (default: the manifest's), with no ledger or cache: a fresh
    /// checkout checked against the committed lock. Exit 1 on a mismatch.
    #[arg(long, value_name = "LOCK", num_args = 0..=1, conflicts_with_all = ["bundle", "sha256"])]
    pub lock: Option<Option<PathBuf>>,
    /// The bundle (`.tar.zst`) written by `uses = "export"`.
    #[arg(required_unless_present = "lock")]
    pub bundle: Option<PathBuf>,
    /// The SHA-256 the archive must have (default: from `BUNDLE.sha256`
    /// beside it).
    #[arg(long, value_name = "HEX")]
    pub sha256: Option<String>,
    /// Refuse a bundle holding a file larger than this (e.g. 512MiB).
    #[arg(long, value_name = "SIZE", default_value = "64GiB", value_parser = parse_size)]
    pub max_file_size: u64,
    /// Refuse a bundle that unpacks to more than this.
    #[arg(long, value_name = "SIZE", default_value = "1TiB", value_parser = parse_size)]
    pub max_total_size: u64,
    /// Machine-readable report on stdout: one JSON object (keys in
    /// docs/releases.md, "`--json`"; with `--lock`, in docs/cli.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RegisterArgs {
    #[command(flatten)]
    pub bundle: BundleArgs,
    /// The registry directory; the freeze goes to `DIR/NAME/VERSION/`.
    #[arg(long, value_name = "DIR")]
    pub into: PathBuf,
}

#[derive(Debug, Args)]
pub struct BuiltinArgs {
    /// `NAME@VERSION`.
    pub name: String,
    /// The invocation: settings and port paths, as JSON.
    pub invocation: String,
}

/// `123`, `4KiB`, `512MiB`, `64GiB`, `1TiB` (also `K`, `M`, `G`, `T`,
/// `KB`…: all powers of 1024).
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size like 512MiB"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(format!(
                "`{text}`: unknown unit `{unit}` (use KiB, MiB, GiB or TiB)"
            ));
        }
    };
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("`{text}` is too large"))
}

#[derive(Debug, Args)]
pub struct ProvenanceArgs {
    /// A stage, or an output path (or a file inside an output directory),
    /// relative to the current directory or absolute.
    pub target: String,
    /// The chain as JSON on stdout (schema in docs/cli.md).
    #[arg(long)]
    pub json: bool,
    /// `intoto`: an in-toto Statement v1 with an SLSA Provenance v1
    /// predicate (JSON on stdout).
    #[arg(long, value_enum)]
    pub format: Option<ProvenanceFormat>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ProvenanceFormat {
    Intoto,
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Mend what the audit finds, in the same pass: re-store damaged
    /// objects from workspace copies that still match, else remove them
    /// (the stages that need them run again); restore differing workspace
    /// copies from the store; set aside results that cannot be read.
    #[arg(long)]
    pub repair: bool,
    /// Every finding as JSON on stdout (schema in docs/cli.md).
    #[arg(long)]
    pub json: bool,
    /// Fail at once (exit 2) if a run is in progress instead of waiting for
    /// it to end.
    #[arg(long)]
    pub no_wait: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Stages to bring up to date, with everything they depend on.
    #[arg(value_name = "STAGE")]
    pub targets: Vec<String>,
    /// Run only if the result matches the committed lock file: refuse
    /// (exit 3, nothing run) when a fingerprint differs from it, and never
    /// rewrite it (exit 3 when a re-run's outputs differ from it).
    #[arg(long)]
    pub locked: bool,
    /// Run at most N commands at once (default: number of cores).
    #[arg(short = 'j', long = "jobs", value_name = "N")]
    pub jobs: Option<usize>,
    /// After a failure, keep running stages that do not depend on it.
    #[arg(short = 'k', long)]
    pub keep_going: bool,
    /// Re-run this stage even if it is fresh, all its items for a per-item
    /// stage; `STAGE/ITEM` re-runs one item (repeatable).
    #[arg(long, value_name = "STAGE[/ITEM]")]
    pub force: Vec<String>,
    /// Run the items of a per-item stage whose outcomes were imported
    /// (`cairn import`) again, to replace them with cairn's own
    /// (repeatable).
    #[arg(long, value_name = "STAGE")]
    pub reverify: Vec<String>,
    /// Show what would run, and why, without running or writing anything.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Fail at once if another cairn process holds the workspace.
    #[arg(long)]
    pub no_wait: bool,
    /// Per-item stages run at most N of their unfinished items (a batch).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Per-item stages run only items in this state.
    #[arg(long, value_enum)]
    pub only: Option<crate::schedule::Only>,
    /// On Ctrl-C, leave the run's Slurm and Kubernetes jobs running instead
    /// of cancelling them: the next run adopts those still wanted (this
    /// machine's commands stop either way).
    #[arg(long)]
    pub detach: bool,
    /// Write the run's events to stdout as JSON lines (one object per
    /// line, with a `v` version field; documented in docs/cli.md) instead
    /// of the human view on stderr.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// Which remote cache a command uses.
#[derive(Debug, Args, Clone, Default)]
pub struct RemoteArgs {
    /// Use this remote cache (an HTTP cache's URL) instead of the
    /// manifest's `[cache.remote] url`.
    #[arg(long, value_name = "URL")]
    pub remote_cache: Option<String>,
    /// Use no remote cache, even if the manifest names one.
    #[arg(long, conflicts_with = "remote_cache")]
    pub no_remote_cache: bool,
}

#[derive(Debug, Args)]
pub struct TransferArgs {
    /// Stages to move (default: every stage).
    #[arg(value_name = "STAGE")]
    pub targets: Vec<String>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// `cairn key` (with `-q`: the public key alone).
#[derive(Debug, Args)]
pub struct KeyArgs {}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Limit to these stages and what they depend on.
    #[arg(value_name = "STAGE")]
    pub targets: Vec<String>,
    /// Each stage's state and reason as JSON on stdout (schema in
    /// docs/cli.md).
    #[arg(long)]
    pub json: bool,
    /// Fail (exit 3) if a stage's fingerprint differs from the committed
    /// lock file, or the lock file is missing or cannot be trusted.
    #[arg(long)]
    pub locked: bool,
}

#[derive(Debug, Args)]
pub struct WhyArgs {
    /// A stage, or an output path (relative to the current directory or
    /// absolute) naming the stage that writes it.
    pub stage: String,
    /// The reason and the changed components as JSON on stdout (schema in
    /// docs/cli.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DagArgs {
    #[arg(long, value_enum, default_value_t = DagFormat::Text)]
    pub format: DagFormat,
    /// Colour each stage by its state now (fresh, stale, never run,
    /// failed), as `cairn status` evaluates it.
    #[arg(long, conflicts_with = "run")]
    pub state: bool,
    /// Colour each stage by how run N left it (ran, fresh, restored,
    /// failed, blocked, …).
    #[arg(long, value_name = "N")]
    pub run: Option<i64>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DagFormat {
    Text,
    Dot,
    Mermaid,
}

#[derive(Debug, Args)]
pub struct LogArgs {
    /// A run's number: its timeline (each selected stage, its state, why,
    /// when it started and how long it took). Or a stage: its attempts.
    /// Without: the runs.
    #[arg(value_name = "RUN|STAGE")]
    pub stage: Option<String>,
    /// How many entries.
    #[arg(short = 'n', long, default_value_t = 20)]
    pub limit: usize,
    /// Runs or attempts as JSON on stdout (schema in docs/cli.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The run to report on (default: the newest; `cairn log` lists them).
    #[arg(value_name = "RUN")]
    pub run: Option<i64>,
    /// Write the page here (default: stdout).
    #[arg(short = 'o', long, value_name = "FILE", conflicts_with = "json")]
    pub output: Option<std::path::PathBuf>,
    /// The report's data as JSON on stdout (schema in docs/cli.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// A stage, `STAGE/ITEM` for one item's attempts, or an output path
    /// (relative to the current directory or absolute) naming its stage.
    pub stage: String,
    /// A per-item stage: list every recorded item outcome, with the
    /// fingerprint of the stage code that produced it.
    #[arg(long)]
    pub items: bool,
    /// With `--items`: only the outcomes produced by stage code whose
    /// fingerprint starts with this (see `code` in `cairn show STAGE`).
    #[arg(long, value_name = "FINGERPRINT")]
    pub code: Option<String>,
    /// The stage (or item) as JSON on stdout (schema in docs/cli.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ResampleArgs {
    /// `STAGE` (every sample of every item), `STAGE/ITEM` (every sample
    /// of one item) or `STAGE/ITEM#INDEX` (one sample).
    #[arg(required = true, value_name = "STAGE[/ITEM[#INDEX]]")]
    pub targets: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The per-item stage the outcomes belong to.
    pub stage: String,
    /// A JSONL file, one line an item: `{"key": …, "class": …}`, and
    /// optionally `"result"` (its JSON result) and `"source"` (where the
    /// verdict came from).
    #[arg(value_name = "FILE")]
    pub outcomes: std::path::PathBuf,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    /// List what would be removed without removing it.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
}
