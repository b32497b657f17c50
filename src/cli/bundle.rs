//! `cairn verify` and `cairn register`.

use std::path::Path;

use super::args::{BundleArgs, Global, RegisterArgs, VerifyArgs};
use super::error::{CliError, exit};
use super::render;
use super::verify_lock;
use crate::release::{self, Limits, Registered, ReleaseError, Verified, expected_digest};

pub fn verify(global: &Global, args: &VerifyArgs) -> Result<(), CliError> {
    if let Some(lock) = &args.lock {
        return verify_lock::verify_lock(global, lock.as_deref(), args.json);
    }
    let Some(bundle) = args.bundle.clone() else {
        return Err(CliError::usage("give a bundle to verify, or `--lock`"));
    };
    let args = &BundleArgs {
        bundle,
        sha256: args.sha256.clone(),
        max_file_size: args.max_file_size,
        max_total_size: args.max_total_size,
        json: args.json,
    };
    let pin = pin(&args.bundle, args.sha256.as_deref())?;
    let limits = limits(args);
    let verified = release::verify_bundle(
        &args.bundle,
        pin.as_ref().map(|(hex, _)| hex.as_str()),
        &limits,
    );
    let verified = match verified {
        Ok(verified) => verified,
        Err(error) => return refused(&args.bundle, error, args.json),
    };
    if args.json {
        render::json(&serde_json::json!({
            "ok": true,
            "bundle": args.bundle,
            "sha256": verified.sha256,
            "pinned_by": pin.as_ref().map(|(_, from)| from),
            "name": verified.manifest.name,
            "version": verified.manifest.version,
            "semantic_digest": verified.manifest.semantic_digest,
            "counts": verified.manifest.counts,
            "total": verified.manifest.total,
            "files": verified.files.len(),
            "bytes": verified.bytes,
            "lineage": verified.lineage,
        }))?;
        return Ok(());
    }
    outln!("verified {}", args.bundle.display());
    let pinned = match &pin {
        Some((_, from)) => format!("matches {from}"),
        None => "not pinned: pass --sha256 HEX to check it".to_owned(),
    };
    outln!("  sha256           {} ({pinned})", verified.sha256);
    summary(&verified)?;
    Ok(())
}

pub fn register(args: &RegisterArgs) -> Result<(), CliError> {
    let into = &args.into;
    let args = &args.bundle;
    let Some((expected, from)) = pin(&args.bundle, args.sha256.as_deref())? else {
        return Err(CliError::Usage {
            message: format!(
                "no digest to check `{}` against",
                args.bundle.display()
            ),
            help: Some(
                "pass --sha256 HEX (the digest you were given), or keep BUNDLE.sha256 beside the bundle"
                    .to_owned(),
            ),
        });
    };
    let limits = limits(args);
    let registration = match release::register(&args.bundle, &expected, into, &limits) {
        Ok(registration) => registration,
        Err(error) => return refused(&args.bundle, error, args.json),
    };
    if args.json {
        render::json(&registration)?;
        return Ok(());
    }
    match registration.outcome {
        Registered::Imported => outln!(
            "registered {} {} (sha256 {}, matches {from}) at {}",
            registration.name,
            registration.version,
            registration.sha256,
            registration.path.display()
        ),
        Registered::AlreadyPresent => outln!(
            "{} {} is already registered with this digest at {}; nothing to do",
            registration.name,
            registration.version,
            registration.path.display()
        ),
    }
    Ok(())
}

/// The digest the bundle must have, if any; a bundle that is not there or
/// a malformed digest is bad input.
fn pin(bundle: &Path, given: Option<&str>) -> Result<Option<(String, String)>, CliError> {
    if !bundle.is_file() {
        return Err(CliError::usage(format!(
            "no bundle at `{}`",
            bundle.display()
        )));
    }
    expected_digest(bundle, given).map_err(|e| CliError::usage(e.to_string()))
}

fn limits(args: &BundleArgs) -> Limits {
    Limits {
        max_file: args.max_file_size,
        max_total: args.max_total_size,
    }
}

fn summary(verified: &Verified) -> Result<(), CliError> {
    let manifest = &verified.manifest;
    outln!("  dataset          {} {}", manifest.name, manifest.version);
    outln!("  semantic digest  {}", manifest.semantic_digest);
    let counts: Vec<String> = manifest
        .counts
        .iter()
        .map(|(split, n)| format!("{split} {n}"))
        .collect();
    outln!(
        "  splits           {} ({} items)",
        counts.join(", "),
        manifest.total
    );
    outln!(
        "  files            {} ({} bytes)",
        verified.files.len(),
        verified.bytes
    );
    if let Some(traced) = verified.lineage {
        outln!(
            "  lineage          {traced} of {} items traced, in the attestation",
            manifest.total
        );
    }
    Ok(())
}

/// Reports a refusal (every problem) and fails with exit 1.
fn refused(bundle: &Path, error: ReleaseError, json: bool) -> Result<(), CliError> {
    let ReleaseError::Refused(problems) = error else {
        return Err(error.into());
    };
    if json {
        let problems: Vec<String> = problems.iter().map(|p| plain_text(p)).collect();
        render::json(&serde_json::json!({
            "ok": false,
            "bundle": bundle,
            "problems": problems,
        }))?;
    } else {
        errln!("error: refused `{}`:", bundle.display());
        for problem in &problems {
            errln!("  - {problem}");
        }
    }
    Err(CliError::Exit(exit::STAGE_FAILED))
}

/// A problem as plain text for `--json`: the human messages mark names and
/// paths with backticks, which mean nothing to a program reading JSON.
fn plain_text(problem: &str) -> String {
    problem.replace('`', "")
}
