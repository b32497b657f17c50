//! `uses = "export"`: a freeze as a reproducible bundle (see
//! `crate::release`), and its SHA-256 in `sha256sum` format beside it; with
//! `lineage`, each item's chain in the bundle's attestation.

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
    let lineage = match invocation.optional_input("lineage") {
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| crate::release::ReleaseError::io(&path, e))?;
            Some(serde_json::from_str(&text).map_err(|e| {
                BuiltinError::Invocation(format!("`{}` is not JSON: {e}", path.display()))
            })?)
        }
        None => None,
    };
    let written = write_bundle(&freeze, &bundle, settings.level, lineage.as_ref())?;
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
