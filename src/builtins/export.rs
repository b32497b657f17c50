//! `uses = "export"`: a freeze as a reproducible bundle (see
//! `crate::release`), and its SHA-256 in `sha256sum` format beside it.

use serde::Deserialize;

use super::{BuiltinError, Invocation};
use crate::release::{write_atomic, write_bundle};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(default = "default_level")]
    level: i32,
}

fn default_level() -> i32 {
    3
}

pub fn run(invocation: &Invocation) -> Result<String, BuiltinError> {
    let settings: Settings = invocation.settings()?;
    let freeze = invocation.input("freeze")?;
    let bundle = invocation.output("bundle")?;
    let sidecar = invocation.output("sha256")?;
    let written = write_bundle(&freeze, &bundle, settings.level)?;
    let file_name = bundle
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    write_atomic(
        &sidecar,
        format!("{}  {file_name}\n", written.sha256).as_bytes(),
    )?;
    Ok(format!(
        "exported {} {}: {} files, {} bytes, sha256 {}",
        written.manifest.name,
        written.manifest.version,
        written.files,
        written.bytes,
        written.sha256
    ))
}
