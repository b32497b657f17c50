//! `uses = "register"`: `cairn register` as a stage. The bundle must match
//! the digest in its `sha256` input; the receipt records what was
//! registered, without times, so a re-run writes the same bytes.

use serde::Deserialize;

use super::{BuiltinError, Invocation};
use crate::release::{Limits, Registered, read_sha256_file, register, write_atomic};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    into: String,
}

pub fn run(invocation: &Invocation) -> Result<String, BuiltinError> {
    let settings: Settings = invocation.settings()?;
    let bundle = invocation.input("bundle")?;
    let sidecar = invocation.input("sha256")?;
    let receipt = invocation.output("receipt")?;
    let expected = read_sha256_file(&sidecar)?;
    let into = std::path::Path::new(&settings.into);
    let registration = register(&bundle, &expected, into, &Limits::default())?;
    let record = serde_json::json!({
        "name": registration.name,
        "version": registration.version,
        "sha256": registration.sha256,
        "semantic_digest": registration.semantic_digest,
        "total": registration.total,
        "registry": settings.into,
    });
    let mut bytes = serde_json::to_vec_pretty(&record).expect("receipts serialise");
    bytes.push(b'\n');
    write_atomic(&receipt, &bytes)?;
    let what = match registration.outcome {
        Registered::Imported => "registered",
        Registered::AlreadyPresent => "already registered (nothing written)",
    };
    Ok(format!(
        "{} {} {what} in `{}`",
        registration.name,
        registration.version,
        registration.path.display()
    ))
}
