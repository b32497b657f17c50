//! Fingerprints: what a stage's result depends on, by content.
//!
//! A stage's fingerprint is the BLAKE3 of the canonical bytes of its
//! [`StageKey`], a sorted map of named components. Each component keeps a
//! digest and a short description, and the whole key is recorded with every
//! result, so `cairn why` is a diff of two keys rather than a guess.
//!
//! | component          | hashed                                              |
//! |--------------------|-----------------------------------------------------|
//! | `command`          | the interpolated command (shell text or argv)       |
//! | `checks`           | the interpolated check commands, in order           |
//! | `outputs`          | the declared output names and paths                 |
//! | `param:NAME`       | canonical JSON of each param the stage uses         |
//! | `env:NAME`         | each declared variable's value (or its absence)     |
//! | `input:PATH`       | the content digest of each input (file or tree)     |
//! | `version`          | the manual cache-buster, if set                     |
//! | `secrets`          | the names of the secrets a stage gets (never values)|
//! | `foreach`          | a per-item stage's item key, inputs, rules, result  |
//! | `classify`         | a stage's classify rules (not per-item), if given   |
//! | `image`            | the digest of the image a stage's pods run in       |
//! |                    | ([`image_component`], once the scheduler pins it)   |
//! | `items`            | each item's key and fingerprint, in key order       |
//! | `samples`          | how a sampled stage's samples are reported          |
//! | `accepts`          | what a per-item stage accepts of its items          |
//! |                    | (the three: [`add_item_components`], once planned)  |
//! | (schema version)   | [`KEY_SCHEMA_VERSION`], inside the encoding         |
//!
//! That is the whole pre-image of a stage's fingerprint: every component
//! is built here. An item's own fingerprint is [`item_fingerprint`].
//!
//! Never hashed: mtimes, owners, inode numbers, absolute paths of the
//! project, the order of tables in the manifest, the order `readdir`
//! returns entries in, the run id or time of an upstream stage. Upstream
//! outputs enter as `input:` components by their content, which is what
//! makes early cutoff work: an upstream re-run that writes the same bytes
//! leaves every downstream fingerprint unchanged.

mod content;
mod digest;
mod key;

pub use content::{
    Content, DirStat, EntryKind, PathMap, StatCache, StatEntry, TreeEntry, Vouched, hash_file,
    is_executable, now_ns, open_regular, path_bytes, read_regular, refuse_special,
    stat_side_by_side, tree_digest, unchanged,
};
pub use digest::{Digest, DigestHashed, DigestMap, ParseDigestError, hex};
pub use key::{Change, Component, KEY_SCHEMA_VERSION, StageKey};

use crate::manifest::{Command, EnvValue, Foreach, Stage};

/// Builds the key of `stage` from the digests of its inputs (in declaration
/// order) and a view of cairn's environment for pass-through variables.
pub fn stage_key(
    stage: &Stage,
    input_digests: &[Digest],
    mut environment: impl FnMut(&str) -> Option<String>,
) -> StageKey {
    let mut key = StageKey::default();
    let mut command = command_component("command", &stage.run);
    if stage.uses.is_some() {
        // Shown by `why`: the built-in and its settings (the ports are
        // components of their own), not the whole invocation.
        command.detail = stage.describe_run();
    }
    key.insert("command", command);
    if !stage.checks.is_empty() {
        let text: Vec<String> = stage.checks.iter().map(Command::display).collect();
        let encoded = canonical_json(&stage.checks.iter().map(command_json).collect());
        key.insert(
            "checks",
            Component::of_value("checks", encoded.as_bytes(), text.join(" ; ")),
        );
    }
    let outputs: Vec<(&str, &str)> = stage
        .outputs
        .iter()
        .map(|o| (o.name.as_str(), o.path.as_str()))
        .collect();
    if !outputs.is_empty() {
        let encoded = serde_json::to_vec(&outputs).expect("outputs serialise");
        let detail: Vec<String> = outputs.iter().map(|(n, p)| format!("{n}={p}")).collect();
        key.insert(
            "outputs",
            Component::of_value("outputs", &encoded, detail.join(", ")),
        );
    }
    for (name, value) in &stage.params {
        let canonical = canonical_json(value);
        key.insert(
            format!("param:{name}"),
            Component::of_value("param", canonical.as_bytes(), canonical.clone()),
        );
    }
    for (name, value) in &stage.env {
        let component = match value {
            EnvValue::Literal(text) => Component::of_value("env", text.as_bytes(), text.clone()),
            EnvValue::PassThrough => match environment(name) {
                Some(text) => {
                    Component::of_value("env-pass", text.as_bytes(), "(passed through, set)")
                }
                None => Component::of_value("env-unset", b"", "(passed through, unset)"),
            },
        };
        key.insert(format!("env:{name}"), component);
    }
    for (input, digest) in stage.inputs.iter().zip(input_digests) {
        key.insert(
            format!("input:{}", input.path),
            Component::of_digest(*digest, String::new()),
        );
    }
    if !stage.secrets.is_empty() {
        // Which secrets a stage gets can change what it does; their values
        // (a rotated token) must not, and never enter a record.
        let names = stage.secrets.join(",");
        key.insert(
            "secrets",
            Component::of_value("secrets", names.as_bytes(), names.clone()),
        );
    }
    if let Some(foreach) = &stage.foreach {
        // How items are identified, what they read and how their outcomes
        // are classified change what a result means; the item list itself
        // does not enter here: each item has its own fingerprint.
        let rules: Vec<&str> = stage.classify.iter().map(|r| r.text.as_str()).collect();
        let result_checks: Vec<&str> = foreach
            .result_checks
            .iter()
            .map(|c| c.text.as_str())
            .collect();
        let spec = serde_json::json!({
            "key": foreach.key,
            "item_inputs": foreach.item_inputs,
            "classify": rules,
            "item_result": foreach.result,
            "result_checks": result_checks,
        });
        let mut spec = spec;
        if let Some(trajectory) = &foreach.trajectory {
            // Only when used, as below.
            spec["item_trajectory"] = trajectory.as_str().into();
        }
        if !foreach.item_outputs.is_empty() {
            // Only when used, so that older per-item results stay valid.
            let outputs: Vec<String> = foreach
                .item_outputs
                .iter()
                .map(|o| format!("{}/{}", o.output, o.template))
                .collect();
            spec["item_outputs"] = outputs.into();
        }
        let encoded = canonical_json(&spec);
        key.insert(
            "foreach",
            Component::of_value("foreach", encoded.as_bytes(), encoded.clone()),
        );
    }
    if stage.foreach.is_none() && !stage.classify.is_empty() {
        // Rules can make a failed exit a success; only when given, so that
        // results of stages without rules stay valid.
        let rules: Vec<&str> = stage.classify.iter().map(|r| r.text.as_str()).collect();
        let encoded = serde_json::to_vec(&rules).expect("rules serialise");
        key.insert(
            "classify",
            Component::of_value("classify", &encoded, rules.join(" ; ")),
        );
    }
    if let Some(version) = &stage.version {
        key.insert(
            "version",
            Component::of_value("version", version.as_bytes(), version.clone()),
        );
    }
    key
}

/// The `image` component: the image a stage's commands run in, by its
/// pinned digest: by content, so a moved tag re-runs the stage and the
/// same image mirrored under another name does not.
pub fn image_component(digest: &str, reference: &str) -> Component {
    Component::of_value("image", digest.as_bytes(), reference.to_owned())
}

/// What a per-item stage's key adds once its items are planned: the stage
/// as a whole is its template plus each item's fingerprint (`items`, each
/// item's key and fingerprint in key order: adding one item changes it,
/// the list's order does not), and how it reports and accepts its items
/// (`samples`, `accepts`: a change to either decides or writes the stage
/// anew, with no item run).
pub fn add_item_components<'a>(
    key: &mut StageKey,
    foreach: &Foreach,
    in_key_order: impl Iterator<Item = (&'a str, &'a Digest)>,
    count: usize,
) {
    let listing = in_key_order.flat_map(|(item, fingerprint)| {
        [
            item.as_bytes(),
            b"\0".as_slice(),
            fingerprint.as_bytes().as_slice(),
        ]
    });
    key.insert(
        "items",
        Component::of_parts("items", listing, format!("{count} items")),
    );
    if let Some(samples) = &foreach.samples {
        // How the samples are reported enters the stage (what it writes),
        // not its items: no sample is drawn again for it.
        let shown = samples.describe();
        key.insert(
            "samples",
            Component::of_value("samples", shown.as_bytes(), shown.clone()),
        );
    }
    let mut accepts = format!("allow_errors = {}", foreach.allow_errors);
    if let Some(isolate) = &foreach.isolate {
        accepts.push_str(&format!(
            ", isolate by {} (smoke {}, mark {})",
            isolate.by, isolate.smoke, isolate.mark
        ));
    }
    key.insert(
        "accepts",
        Component::of_value("accepts", accepts.as_bytes(), accepts.clone()),
    );
}

fn command_component(kind: &str, command: &Command) -> Component {
    let encoded = canonical_json(&command_json(command));
    Component::of_value(kind, encoded.as_bytes(), command.display())
}

fn command_json(command: &Command) -> serde_json::Value {
    match command {
        Command::Shell(script) => serde_json::json!({ "shell": script }),
        Command::Exec(argv) => serde_json::json!({ "exec": argv }),
    }
}

/// JSON with object keys sorted, so equal values give equal bytes (see
/// [`crate::canonical_json`]).
pub fn canonical_json(value: &serde_json::Value) -> String {
    crate::canonical_json::to_string(value)
}

/// An item's fingerprint: its stage's template fingerprint, the item's
/// canonical JSON and the content of the paths it reads.
pub fn item_fingerprint(
    template: &Digest,
    canonical_item: &str,
    inputs: &[(String, Digest)],
) -> Digest {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"cairn.item\0");
    hasher.update(template.as_bytes());
    hasher.update(&(canonical_item.len() as u64).to_le_bytes());
    hasher.update(canonical_item.as_bytes());
    for (path, digest) in inputs {
        hasher.update(&(path.len() as u64).to_le_bytes());
        hasher.update(path.as_bytes());
        hasher.update(digest.as_bytes());
    }
    Digest::from_hash(hasher.finalize())
}
