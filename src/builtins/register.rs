//! `uses = "register"`: `cairn register` as a stage. The bundle must match
//! the digest in its `sha256` input; the receipt records what was
//! registered, without times, so a re-run writes the same bytes.
//!
//! The import into the registry is the stage's work, and the registry is
//! not one of its outputs (it holds every version, and is meant to outlive
//! the pipeline's state): a receipt restored from the store or taken from
//! a remote cache does not bring it back. So a result of this stage counts
//! only while its registry still holds what its receipt names
//! ([`missing`]), and a remote cache is never asked for one.

use serde::Deserialize;

use super::{BuiltinError, Invocation};
use crate::release::{Lack, Limits, Registered, lacks, read_sha256_file, register, write_atomic};

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

/// What a receipt says is registered and its registry (relative to the
/// project root `root`) no longer holds, in words; `None` if it is all
/// there.
pub fn missing(receipt: &[u8], root: &std::path::Path) -> Option<String> {
    #[derive(Deserialize)]
    struct Receipt {
        name: String,
        version: String,
        sha256: String,
        registry: String,
    }
    let r = match serde_json::from_slice::<Receipt>(receipt) {
        Ok(r) => r,
        Err(e) => return Some(format!("its receipt cannot be read: {e}")),
    };
    let (name, version, at) = (&r.name, &r.version, &r.registry);
    lacks(&root.join(at), name, version, &r.sha256).map(|lack| match lack {
        Lack::Unlisted => format!("the registry `{at}` does not hold {name} {version}"),
        Lack::OtherDigest => {
            format!("the registry `{at}` holds {name} {version} from another bundle")
        }
        Lack::FilesGone => {
            format!("the registry `{at}` lists {name} {version}, but its files are gone")
        }
        Lack::Unreadable(why) => why,
    })
}
