//! Loading the manifest and graph, and opening the cache, for a command.

use std::path::PathBuf;

use super::args::Global;
use super::error::CliError;
use crate::file_stat::Stated;
use crate::graph::Dag;
use crate::manifest::{self, LoadError, Manifest};
use crate::schedule::Context;
use crate::schedule::proof::{self, CHECK_VAR};
use crate::store::{Ledger, PipelineId, WhenLocked, WorkspaceLock};

pub struct Loaded {
    pub manifest: Manifest,
    pub dag: Dag,
}

/// The manifest a command works on: `-f PATH`, or else `cairn.toml` in the
/// current directory or the nearest parent that has one (as cargo finds
/// `Cargo.toml` and git finds `.git`).
pub fn manifest_path(global: &Global) -> Result<PathBuf, CliError> {
    if let Some(file) = &global.file {
        if file.exists() {
            return Ok(file.clone());
        }
        return Err(CliError::Usage {
            message: format!("no manifest at `{}`", file.display()),
            help: Some("check the path given to `-f`".to_owned()),
        });
    }
    let cwd = std::env::current_dir().map_err(CliError::Output)?;
    cwd.ancestors()
        .map(|dir| dir.join(DEFAULT_MANIFEST))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| CliError::Usage {
            message: format!(
                "no `{DEFAULT_MANIFEST}` in `{}` or any parent directory",
                cwd.display()
            ),
            help: Some(format!(
                "run cairn inside a project with a `{DEFAULT_MANIFEST}`, or pass `-f path/to/pipeline.toml`"
            )),
        })
}

const DEFAULT_MANIFEST: &str = "cairn.toml";

/// Loads and validates the manifest and its graph; nothing is written.
pub fn load(global: &Global) -> Result<Loaded, CliError> {
    let path = manifest_path(global)?;
    let manifest = manifest::load(&path, global.profile.as_deref())?;
    let dag = Dag::build(&manifest).map_err(LoadError::from)?;
    Ok(Loaded { manifest, dag })
}

/// The manifest kept (encoded as `kept`) beside a proof, and its graph,
/// if it was kept for the manifest this command names and what it found
/// on disk still holds (see [`manifest::kept`]); `None` if not.
///
/// With `CAIRN_CHECK_FRESH_PROOF` set (as the test suite does), the
/// manifest is also loaded the usual way, and any difference is an
/// internal error.
pub fn take_up(global: &Global, kept: &[u8], stated: &Stated) -> Result<Option<Loaded>, CliError> {
    let path = manifest_path(global)?;
    let profile = global.profile.as_deref();
    let Some(manifest) = manifest::kept::take_up(kept, &path, profile, stated) else {
        tracing::debug!("the kept manifest was not taken up: it is loaded again");
        return Ok(None);
    };
    if std::env::var_os(CHECK_VAR).is_some() {
        let usual = manifest::load(&path, profile).map(|usual| format!("{usual:?}"));
        if usual.as_deref().ok() != Some(format!("{manifest:?}").as_str()) {
            return Err(CliError::Usage {
                message: format!(
                    "internal error: the manifest kept for `{}` is not the manifest as loaded now",
                    path.display()
                ),
                help: Some("please report this as a cairn bug".to_owned()),
            });
        }
    }
    let dag = Dag::build(&manifest).map_err(LoadError::from)?;
    tracing::debug!("the manifest was taken up as it was kept");
    Ok(Some(Loaded { manifest, dag }))
}

impl Loaded {
    /// Stage indices for names given on the command line.
    pub fn stage_indices(&self, names: &[String]) -> Result<Vec<usize>, CliError> {
        names
            .iter()
            .map(|name| {
                self.manifest
                    .stages
                    .iter()
                    .position(|s| &s.name == name)
                    .ok_or_else(|| self.unknown_stage(name))
            })
            .collect()
    }

    pub fn unknown_stage(&self, name: &str) -> CliError {
        let names: Vec<&str> = self
            .manifest
            .stages
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        let close = names
            .iter()
            .filter(|n| strsim::levenshtein(n, name) <= 2)
            .map(|n| format!("did you mean `{n}`?"))
            .next();
        CliError::Usage {
            message: format!(
                "no stage named `{name}` in `{}`",
                self.manifest.path.display()
            ),
            help: Some(close.unwrap_or_else(|| format!("stages: {}", names.join(", ")))),
        }
    }

    /// The targets plus their upstream closure; every stage when empty.
    pub fn selection(&self, targets: &[String]) -> Result<Vec<bool>, CliError> {
        if targets.is_empty() {
            return Ok(vec![true; self.manifest.stages.len()]);
        }
        let indices = self.stage_indices(targets)?;
        Ok(self.dag.upstream_closure(&indices))
    }

    /// A read-only view: the ledger if one exists; writes nothing. A lock
    /// file that cannot be trusted is reported here, once per command.
    pub fn read_context(&self) -> Result<Context<'_>, CliError> {
        let ledger =
            Ledger::open_existing(&self.manifest.cache_dir(), &PipelineId::of(&self.manifest))?;
        let mut ctx = Context::new(&self.manifest, &self.dag, ledger)?;
        // A per-item stage whose list is unchanged since the last proof is
        // planned from the plan kept beside it, as a run would plan it.
        if let Some(key) = proof::key_of(&self.manifest) {
            ctx = ctx.with_plans_kept_under(key);
        }
        if let Some(problem) = &ctx.lock_problem {
            errln!("warning: {problem}");
        }
        Ok(ctx)
    }

    /// Persists stat-cache entries learnt by a read-only command, if no
    /// other process is writing the workspace.
    pub fn save_learnt(&self, ctx: &mut Context<'_>) {
        if ctx.ledger.is_some()
            && let Some(_lock) = WorkspaceLock::try_acquire(&self.manifest.cache_dir())
        {
            let _ = ctx.save_stat_cache(false);
        }
    }
}

/// Holds the workspace of `manifest` for writing: waits for another cairn
/// that holds it (saying so), or with `no_wait` fails at once.
pub fn hold(manifest: &Manifest, no_wait: bool) -> Result<WorkspaceLock, CliError> {
    let cache = manifest.cache_dir();
    let when_locked = if no_wait {
        WhenLocked::Fail
    } else {
        WhenLocked::Wait
    };
    Ok(WorkspaceLock::acquire(&cache, when_locked, |holder| {
        let who = holder
            .map(|pid| format!(" (pid {pid})"))
            .unwrap_or_default();
        errln!(
            "waiting for another cairn process{who} to release the workspace `{}`…",
            cache.display()
        );
    })?)
}
