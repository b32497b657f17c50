//! The built-in stages (`uses = "NAME"`), one file each. A built-in stage
//! runs as `cairn builtin NAME@VERSION INVOCATION`: a process like any
//! command, with the same timeouts, logs, output checks and store path.
//! Its signature (ports and settings) is in `crate::manifest::catalog`.

mod export;
mod freeze;
pub mod gate;
mod groups;
mod oci_mirror;
mod register;
pub mod select;
pub mod split;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::manifest::catalog;
use crate::release::ReleaseError;

/// The output of built-in `name` that describes work it does beyond its
/// declared outputs, if it does any: `register`'s receipt (the import into
/// the registry), `oci-mirror`'s list of mirrored images (the copies in
/// its target). A result of such a stage counts only while that work is
/// still in place ([`missing_effect`]), and is never taken from a remote
/// cache, which cannot bring it back: the stage runs here, where redoing
/// work already done is a check that copies nothing.
pub fn effect_output(name: &str) -> Option<&'static str> {
    match name {
        "register" => Some("receipt"),
        "oci-mirror" => Some("mirrored"),
        _ => None,
    }
}

/// What is missing of the work a result of the built-in `uses` stands
/// for, given the bytes of its [`effect_output`] and the project root;
/// `None` if it is all in place.
pub fn missing_effect(
    uses: &crate::manifest::Uses,
    described: &[u8],
    root: &std::path::Path,
) -> Option<String> {
    match uses.name.as_str() {
        "register" => register::missing(described, root),
        "oci-mirror" => oci_mirror::missing(&uses.with, described, root),
        _ => None,
    }
}

/// What a built-in is given: its settings and its ports' paths (relative
/// to the project root, which is the working directory).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Invocation {
    pub with: serde_json::Value,
    pub inputs: BTreeMap<String, String>,
    pub outputs: BTreeMap<String, String>,
}

impl Invocation {
    pub fn input(&self, name: &str) -> Result<PathBuf, BuiltinError> {
        self.inputs
            .get(name)
            .map(PathBuf::from)
            .ok_or_else(|| BuiltinError::Invocation(format!("no input named `{name}`")))
    }

    fn optional_input(&self, name: &str) -> Option<PathBuf> {
        self.inputs.get(name).map(PathBuf::from)
    }

    fn optional_output(&self, name: &str) -> Option<PathBuf> {
        self.outputs.get(name).map(PathBuf::from)
    }

    pub fn output(&self, name: &str) -> Result<PathBuf, BuiltinError> {
        self.outputs
            .get(name)
            .map(PathBuf::from)
            .ok_or_else(|| BuiltinError::Invocation(format!("no output named `{name}`")))
    }

    fn settings<T: serde::de::DeserializeOwned>(&self) -> Result<T, BuiltinError> {
        serde_json::from_value(self.with.clone())
            .map_err(|e| BuiltinError::Invocation(format!("bad `with`: {e}")))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BuiltinError {
    #[error("unknown built-in `{0}`")]
    Unknown(String),
    #[error("this cairn runs built-in `{name}` version {have}, not {wanted}; re-run the stage")]
    Version {
        name: String,
        have: u32,
        wanted: String,
    },
    #[error("invalid invocation: {0}")]
    Invocation(String),
    /// Declared checks that failed: every violation.
    #[error("{} check(s) failed:\n{}", .0.len(), .0.iter().map(|v| format!("  - {v}")).collect::<Vec<_>>().join("\n"))]
    Checks(Vec<String>),
    /// The work could not be done; the message says why.
    #[error("{0}")]
    Failed(String),
    /// What it depends on failed (a registry kept answering 5xx, a
    /// connection kept failing): infrastructure, never a verdict; the
    /// command exits 75, which a `classify` rule can call `infra`.
    #[error("{0}")]
    Infra(String),
    #[error(transparent)]
    Release(#[from] ReleaseError),
}

/// Runs built-in `name_version` (`NAME@VERSION`) on the JSON `invocation`;
/// returns a one-line summary for the stage's log.
pub fn run(name_version: &str, invocation: &str) -> Result<String, BuiltinError> {
    let (name, invocation) = prepare(name_version, invocation)?;
    match name {
        "select" => select::run(&invocation),
        "split" => split::run(&invocation),
        "gate" => gate::run(&invocation),
        "groups" => groups::run(&invocation),
        "oci-mirror" => oci_mirror::run(&invocation),
        "freeze" => freeze::run(&invocation),
        "export" => export::run(&invocation),
        // It reads the ledger: the command line layer runs it.
        "lineage" => Err(BuiltinError::Invocation(
            "`lineage` runs through `cairn builtin`, which reads the workspace".to_owned(),
        )),
        "register" => register::run(&invocation),
        other => Err(BuiltinError::Unknown(other.to_owned())),
    }
}

/// The built-in `NAME@VERSION` names, if this cairn runs that version, and
/// its invocation, parsed.
pub fn prepare(
    name_version: &str,
    invocation: &str,
) -> Result<(&'static str, Invocation), BuiltinError> {
    let (name, wanted) = name_version.split_once('@').unwrap_or((name_version, ""));
    let spec = catalog::builtin(name).ok_or_else(|| BuiltinError::Unknown(name.to_owned()))?;
    if wanted != spec.version.to_string() {
        return Err(BuiltinError::Version {
            name: name.to_owned(),
            have: spec.version,
            wanted: wanted.to_owned(),
        });
    }
    let invocation: Invocation =
        serde_json::from_str(invocation).map_err(|e| BuiltinError::Invocation(e.to_string()))?;
    Ok((spec.name, invocation))
}

/// The records of a JSON array or JSONL file.
fn read_records(
    path: &std::path::Path,
    what: &str,
) -> Result<Vec<serde_json::Value>, BuiltinError> {
    crate::records::read(path, what).map_err(BuiltinError::Invocation)
}

/// IDs from a JSON array or JSONL file of strings, or of records with `key`.
fn read_ids(
    path: &std::path::Path,
    key: &str,
) -> Result<std::collections::BTreeSet<String>, BuiltinError> {
    Ok(read_id_list(path, key)?.into_iter().collect())
}

/// The same, in the file's order.
fn read_id_list(path: &std::path::Path, key: &str) -> Result<Vec<String>, BuiltinError> {
    let mut ids = Vec::new();
    for (n, value) in read_records(path, "ID list")?.iter().enumerate() {
        let id = match value {
            serde_json::Value::String(s) => Some(s.clone()),
            other => crate::manifest::settings::field_text(other, key),
        };
        match id {
            Some(id) => ids.push(id),
            None => {
                return Err(BuiltinError::Invocation(format!(
                    "entry {} of `{}` is neither a string nor a record with `{key}`",
                    n + 1,
                    path.display()
                )));
            }
        }
    }
    Ok(ids)
}

/// Writes one JSON record per line, atomically.
fn write_jsonl<'a>(
    path: &std::path::Path,
    records: impl Iterator<Item = &'a serde_json::Value>,
) -> Result<(), BuiltinError> {
    let mut text = String::new();
    for record in records {
        text.push_str(&serde_json::to_string(record).expect("JSON values serialise"));
        text.push('\n');
    }
    crate::release::write_atomic(path, text.as_bytes()).map_err(Into::into)
}

/// Writes pretty JSON, atomically.
fn write_json(path: &std::path::Path, value: &serde_json::Value) -> Result<(), BuiltinError> {
    let mut text = serde_json::to_string_pretty(value).expect("JSON values serialise");
    text.push('\n');
    crate::release::write_atomic(path, text.as_bytes()).map_err(Into::into)
}
