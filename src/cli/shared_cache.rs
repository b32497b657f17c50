//! The remote cache on the command line: which one a command uses,
//! `cairn push`, `cairn pull` and `cairn key`.

use std::sync::Arc;

use super::args::{Global, KeyArgs, RemoteArgs, TransferArgs};
use super::error::{CliError, exit};
use super::workspace::{self, Loaded};
use crate::manifest::RemoteCacheSpec;
use crate::schedule::{self, Context};
use crate::store::shared_cache::{RemoteCache, SigningKey};
use crate::store::{Ledger, PipelineId, WhenLocked, WorkspaceLock};

/// The remote cache of this command: `--remote-cache URL` (with the
/// manifest's other settings), else the manifest's; none with
/// `--no-remote-cache`.
pub fn open(loaded: &Loaded, args: &RemoteArgs) -> Result<Option<Arc<RemoteCache>>, CliError> {
    open_for(loaded, args, false)
}

/// As [`open`]; `pushing`: uploads are what the command is for, whatever
/// `upload` says (it is about runs).
fn open_for(
    loaded: &Loaded,
    args: &RemoteArgs,
    pushing: bool,
) -> Result<Option<Arc<RemoteCache>>, CliError> {
    if args.no_remote_cache {
        return Ok(None);
    }
    let spec = match (&args.remote_cache, &loaded.manifest.remote_cache) {
        (None, None) => return Ok(None),
        (None, Some(spec)) => spec.clone(),
        (Some(url), spec) => {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(CliError::usage(format!(
                    "`--remote-cache {url}` is not an http:// or https:// address"
                )));
            }
            RemoteCacheSpec {
                url: url.clone(),
                ..spec.clone().unwrap_or_else(|| RemoteCacheSpec::at(url))
            }
        }
    };
    let key_file = spec
        .key
        .as_ref()
        .map(|key| loaded.manifest.root.join(expand_home(key)));
    let remote = RemoteCache::open(&spec, key_file.as_deref(), spec.upload || pushing).map_err(
        |message| {
            CliError::Usage {
        message: format!("cannot use the remote cache: {message}"),
        help: Some(
            "see \"A shared cache\" in docs/cli.md (`cairn run --no-remote-cache` runs without it)"
                .to_owned(),
        ),
    }
        },
    )?;
    Ok(Some(Arc::new(remote)))
}

/// The command line as the ledger records it: an address's credentials
/// (`--remote-cache https://user:password@…`) left out.
pub fn invocation() -> String {
    std::env::args()
        .map(|arg| {
            if arg.contains("://") {
                crate::store::shared_cache::without_credentials(&arg)
            } else {
                arg
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `[cache.remote] key` of the manifest at `path` (relative to the
/// manifest's directory and its `[pipeline] root`), if it names one.
fn configured_key(path: &std::path::Path) -> Result<Option<std::path::PathBuf>, CliError> {
    let text = std::fs::read_to_string(path).map_err(|source| {
        CliError::Manifest(crate::manifest::LoadError::Read {
            path: path.to_owned(),
            source,
        })
    })?;
    let Ok(value) = text.parse::<toml::Table>() else {
        // `cairn status` reports what is wrong with it; the key is the one
        // named outside the manifest.
        return Ok(None);
    };
    let Some(key) = value
        .get("cache")
        .and_then(|c| c.get("remote"))
        .and_then(|r| r.get("key"))
        .and_then(|k| k.as_str())
    else {
        return Ok(None);
    };
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    let root = value
        .get("pipeline")
        .and_then(|p| p.get("root"))
        .and_then(|r| r.as_str())
        .map_or_else(|| dir.to_owned(), |root| dir.join(root));
    Ok(Some(root.join(expand_home(key))))
}

/// `~/x` → `$HOME/x`.
fn expand_home(path: &str) -> std::path::PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => std::path::PathBuf::from(home).join(rest),
        _ => std::path::PathBuf::from(path),
    }
}

fn required(
    loaded: &Loaded,
    args: &RemoteArgs,
    command: &str,
) -> Result<Arc<RemoteCache>, CliError> {
    if args.no_remote_cache {
        return Err(CliError::usage(format!(
            "`cairn {command} --no-remote-cache` has nothing to do: it moves results to or from the remote cache"
        )));
    }
    open_for(loaded, args, command == "push")?.ok_or_else(|| CliError::Usage {
        message: format!("`cairn {command}` needs a remote cache, and none is configured"),
        help: Some(
            "add `[cache.remote] url = \"http://…\"` to the manifest, or pass `--remote-cache URL`"
                .to_owned(),
        ),
    })
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::Output)
}

/// `cairn push [STAGE…]`.
pub fn push(global: &Global, args: &TransferArgs) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let selected = loaded.selection(&args.targets)?;
    let remote = required(&loaded, &args.remote, "push")?;
    let mut ctx = loaded.read_context()?;
    let pushed = runtime()?.block_on(schedule::push(&mut ctx, &selected, &remote))?;
    loaded.save_learnt(&mut ctx);
    outln!(
        "pushed {} stage result(s) and {} item outcome(s) to {}",
        pushed.stages,
        pushed.items,
        remote.url()
    );
    if !pushed.skipped.is_empty() && !global.quiet {
        errln!(
            "not pushed (no current result; `cairn run` makes one): {}",
            pushed.skipped.join(", ")
        );
    }
    if pushed.failed > 0 {
        errln!(
            "error: {} result(s) not uploaded ({})",
            pushed.failed,
            remote
                .down_because()
                .or_else(|| remote.uploads_stopped_because())
                .unwrap_or_else(|| "see the warnings".to_owned())
        );
        return Err(CliError::Exit(exit::STAGE_FAILED));
    }
    Ok(())
}

/// `cairn pull [STAGE…]`.
pub fn pull(global: &Global, args: &TransferArgs) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let selected = loaded.selection(&args.targets)?;
    let remote = required(&loaded, &args.remote, "pull")?;
    let cache = loaded.manifest.cache_dir();
    let _lock = WorkspaceLock::acquire(&cache, WhenLocked::Wait, |holder| {
        let who = holder.map(|p| format!(" (pid {p})")).unwrap_or_default();
        errln!("waiting for another cairn process{who} to release the workspace…");
    })?;
    let ledger = Ledger::open(&cache, &PipelineId::of(&loaded.manifest))?;
    let mut ctx = Context::new(&loaded.manifest, &loaded.dag, Some(ledger))?;
    if ctx.lock.is_none() {
        let why = ctx
            .lock_problem
            .as_ref()
            .map(|p| p.to_string())
            .unwrap_or_else(|| format!("there is no `{}`", loaded.manifest.lock_path().display()));
        return Err(CliError::Usage {
            message: format!("`cairn pull` brings the results the lock file names, and {why}"),
            help: Some("commit the lock file where the results were made (`cairn run` writes it), or let `cairn run` look results up in the remote".to_owned()),
        });
    }
    let invocation = invocation();
    let pulled = runtime()?.block_on(schedule::pull(&mut ctx, &selected, &remote, &invocation))?;
    outln!(
        "pulled {} stage result(s) ({} already here) and {} item outcome(s), {} output(s) restored",
        pulled.pulled.len(),
        pulled.present.len(),
        pulled.items,
        pulled.restored
    );
    if !pulled.missing.is_empty() {
        errln!(
            "error: not in the remote cache (or refused): {}; {}",
            pulled.missing.join(", "),
            schedule::remote_summary(&remote)
        );
        return Err(CliError::Exit(exit::STAGE_FAILED));
    }
    Ok(())
}

/// `cairn key`.
pub fn key(global: &Global, _: &KeyArgs) -> Result<(), CliError> {
    // The manifest's `[cache.remote] key`, when there is a manifest: read
    // from its TOML alone, so that a manifest that does not load here (its
    // inputs absent, say) still names the key it signs with.
    let configured = match workspace::manifest_path(global) {
        Err(_) => None,
        Ok(path) => configured_key(&path)?,
    };
    let key = SigningKey::load(configured.as_deref()).map_err(CliError::usage)?;
    if global.quiet {
        outln!("{}", key.public());
    } else {
        outln!("{}", key.public());
        errln!("signing key: {}", key.source);
        errln!("teammates trust results signed here with, in their manifest:");
        errln!("  [cache.remote]");
        errln!("  trust = [\"{}\"]", key.public());
    }
    Ok(())
}
