//! An in-toto Statement (v1) with an SLSA Provenance (v1) predicate for a
//! lineage: what other tools expect to verify a release with.
//!
//! Subjects are the target's output files, named by their path and digested
//! with SHA-256 (and BLAKE3, cairn's own); each is re-hashed from the
//! workspace and must match what the ledger records, or no statement is
//! made. Dependencies are the source files of the chain. Environment
//! variables appear by name only; secrets not at all.

use sha2::{Digest as _, Sha256};

use super::StoreError;
use super::output_record::OutputKind;
use super::provenance::Lineage;
use crate::fingerprint::{Content, Digest, EntryKind, StatCache, hex};
use crate::manifest::Manifest;

pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
pub const PREDICATE_TYPE: &str = "https://slsa.dev/provenance/v1";
pub const BUILD_TYPE: &str = "https://cairn.dev/buildtypes/pipeline-stage/v1";

#[derive(Debug, thiserror::Error)]
pub enum AttestationError {
    #[error(
        "`{path}` no longer matches its record ({expected}, found {actual}); run `cairn run`, or `cairn audit` to see what changed"
    )]
    Changed {
        path: String,
        expected: Digest,
        actual: Digest,
    },
    /// An in-toto subject is named in JSON, which holds only UTF-8.
    #[error("`{}` has a name that is not UTF-8, which an attestation cannot carry", path.display())]
    NotUtf8 { path: std::path::PathBuf },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The statement for `lineage` (whose last stage made the target).
pub fn statement(
    manifest: &Manifest,
    lineage: &Lineage,
) -> Result<serde_json::Value, AttestationError> {
    let last = lineage
        .stages
        .last()
        .expect("a lineage has its target's stage");
    let wanted = lineage
        .target
        .trim_start_matches("./")
        .trim_end_matches('/');
    let mut subjects = Vec::new();
    for output in &last.outputs {
        let is_target = wanted == last.stage
            || wanted == output.path
            || wanted.starts_with(&format!("{}/", output.path));
        if !is_target {
            continue;
        }
        let abs = manifest.root.join(&output.path);
        let content = StatCache::default()
            .content(&abs)
            .map_err(|e| StoreError::io(&abs, e))?;
        if content.digest() != output.digest {
            return Err(AttestationError::Changed {
                path: output.path.clone(),
                expected: output.digest,
                actual: content.digest(),
            });
        }
        let files: Vec<(String, Digest)> = match (&output.kind, content) {
            (OutputKind::File, _) => vec![(output.path.clone(), output.digest)],
            (OutputKind::Dir, Content::Dir { entries, .. }) => entries
                .into_iter()
                .filter(|e| matches!(e.kind, EntryKind::File | EntryKind::Executable))
                .map(|e| match e.path.to_str() {
                    Some(rel) => Ok((format!("{}/{rel}", output.path), e.digest)),
                    None => Err(AttestationError::NotUtf8 {
                        path: std::path::Path::new(&output.path).join(&e.path),
                    }),
                })
                .collect::<Result<_, _>>()?,
            (OutputKind::Dir, Content::File { .. }) => Vec::new(),
        };
        for (name, blake3) in files {
            if wanted != last.stage && wanted != output.path && wanted != name {
                continue;
            }
            let path = manifest.root.join(&name);
            let bytes = std::fs::read(&path).map_err(|e| StoreError::io(&path, e))?;
            subjects.push(serde_json::json!({
                "name": name,
                "digest": { "sha256": hex(&Sha256::digest(&bytes)), "blake3": blake3.hex() },
            }));
        }
    }
    let dependencies: Vec<serde_json::Value> = lineage
        .sources
        .iter()
        .map(|source| {
            let path = manifest.root.join(&source.path);
            let mut digest = serde_json::json!({ "blake3": source.digest.hex() });
            if let Ok(bytes) = std::fs::read(&path)
                && Digest::of(&bytes) == source.digest {
                    digest["sha256"] = serde_json::Value::from(hex(&Sha256::digest(&bytes)));
                }
            serde_json::json!({ "uri": format!("file:{}", source.path), "name": source.path, "digest": digest })
        })
        .collect();
    let stages: Vec<serde_json::Value> = lineage
        .stages
        .iter()
        .map(|s| {
            serde_json::json!({
                "stage": s.stage,
                "fingerprint": s.fingerprint.to_string(),
                "command": s.command,
                "params": s.params,
                "env": s.env,
                "inputs": s.inputs,
                "outputs": s.outputs.iter().map(|o| serde_json::json!({"path": o.path, "digest": o.digest.to_string()})).collect::<Vec<_>>(),
                "runId": s.run_id,
            })
        })
        .collect();
    let time = |ms: i64| {
        humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64),
        )
        .to_string()
    };
    Ok(serde_json::json!({
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "pipeline": manifest.name,
                    "profile": manifest.profile,
                    "target": lineage.target,
                },
                "internalParameters": if lineage.items.is_empty() {
                    serde_json::json!({ "stages": stages })
                } else {
                    serde_json::json!({ "stages": stages, "items": items_by_content(&lineage.items) })
                },
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": { "id": "https://cairn.dev/builder/local", "version": { "cairn": env!("CARGO_PKG_VERSION") } },
                "metadata": {
                    "invocationId": format!("run-{}", last.run_id),
                    "startedOn": time(last.started_ms),
                    "finishedOn": time(last.finished_ms),
                },
            },
        },
    }))
}

/// Each item of the chain by what it is, without times (the same chain
/// gives the same bytes): stage, key, fingerprints, outcome, its fields,
/// what it read and wrote.
pub fn items_by_content(items: &[super::ItemStep]) -> serde_json::Value {
    items
        .iter()
        .map(|step| {
            let mut item = serde_json::json!({
                "stage": step.stage,
                "key": step.key,
                "fingerprint": step.fingerprint.to_string(),
                "code": step.code.to_string(),
                "outcome": step.class,
                "fields": step.fields,
                "inputs": step.inputs,
                "result": step.result,
                "outputs": step.outputs.iter().map(|o| serde_json::json!({"path": o.path, "digest": o.digest.to_string()})).collect::<Vec<_>>(),
            });
            // An imported outcome says so, and where it came from. (One a
            // remote cache supplied is the same bytes as the one made.)
            if let Some(origin) = step.origin.as_ref().filter(|o| o.starts_with("import:")) {
                item["origin"] = origin.clone().into();
            }
            if let Some(source) = &step.source {
                item["source"] = source.clone().into();
            }
            item
        })
        .collect()
}
