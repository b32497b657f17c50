//! `cairn push` and `cairn pull`: moving current results to and from the
//! remote cache explicitly, like DVC's, with the same checks as a run.
//!
//! Push uploads each selected stage's current result and every final
//! item outcome under its current fingerprint. Pull is driven by the lock
//! file: it brings each stage's result under the fingerprint the lock
//! names (no input needs to be present to know it), checks that its
//! outputs are the ones the lock records, records it with the remote as
//! its origin and restores its outputs. Nothing runs either way.

use futures::StreamExt as _;

use super::ScheduleError;
use super::context::Context;
use super::item_outputs::ItemOutputs;
use super::shared_cache::{are_declared, item_entry, producer, reuse_items, stage_entry};
use super::timeline::{StageState, Timeline};
use crate::fingerprint::StatCache;
use crate::store::shared_cache::{RemoteCache, RemoteStats, What};
use crate::store::{NewResult, OutputKind, OutputRecord, ResultStatus};

/// Entries uploaded at once by `push`.
const PUSHES_IN_FLIGHT: usize = 8;

#[derive(Debug, Default)]
pub struct Pushed {
    pub stages: usize,
    pub items: usize,
    /// Stages with no current result to push.
    pub skipped: Vec<String>,
    pub failed: usize,
}

/// Uploads the current results of the selected stages and the final
/// outcomes of their items.
pub async fn push(
    ctx: &mut Context<'_>,
    selected: &[bool],
    remote: &RemoteCache,
) -> Result<Pushed, ScheduleError> {
    // Item plans (each item's current fingerprint and pre-image) come
    // from evaluating the stages, as `status` does.
    let statuses = super::evaluate(ctx, selected, &Default::default())?;
    let ledger = ctx.ledger.as_ref().ok_or(ScheduleError::NoLedger)?;
    let mut entries = Vec::new();
    let mut pushed = Pushed::default();
    for status in &statuses {
        let Some(i) = ctx
            .manifest
            .stages
            .iter()
            .position(|s| s.name == status.stage)
        else {
            continue;
        };
        let stage = &ctx.manifest.stages[i];
        if let Some(plan) = ctx.item_plan(i) {
            for planned in plan {
                let Some((class, _)) = &planned.outcome else {
                    continue;
                };
                if !class.is_final() {
                    continue;
                }
                let entry = item_entry(
                    &stage.name,
                    planned,
                    class,
                    None,
                    planned.result.as_ref().map(|r| r.to_string()),
                    planned.outputs.as_deref().unwrap_or_default(),
                    producer(ctx.manifest, stage, 0, 0, None),
                );
                entries.push((entry, Vec::new(), false));
            }
        }
        let Some(record) = ctx.latest_ok.get(&stage.name) else {
            pushed.skipped.push(stage.name.clone());
            continue;
        };
        if status.fingerprint != Some(record.fingerprint) {
            // Its current result is not what its inputs make now.
            pushed.skipped.push(stage.name.clone());
            continue;
        }
        let key = ledger.key(record.id)?;
        let mut inline = Vec::new();
        for output in record.outputs.iter().filter(|o| o.inline) {
            if let Some(bytes) = ledger.inline_object(&output.digest)? {
                inline.push((output.digest, bytes));
            }
        }
        let made = producer(
            ctx.manifest,
            stage,
            record.started_ms,
            record.finished_ms,
            record.exit_code,
        );
        entries.push((
            stage_entry(&stage.name, &key, &record.outputs, made),
            inline,
            true,
        ));
    }
    let store = ctx.store.clone();
    let mut uploads =
        futures::stream::iter(entries.into_iter().map(|(entry, inline, is_stage)| {
            let store = store.clone();
            async move { (is_stage, remote.upload(entry, &store, inline).await) }
        }))
        .buffer_unordered(PUSHES_IN_FLIGHT);
    while let Some((is_stage, uploaded)) = uploads.next().await {
        match (uploaded, is_stage) {
            (Ok(()), true) => pushed.stages += 1,
            (Ok(()), false) => pushed.items += 1,
            (Err(_), _) => pushed.failed += 1,
        }
    }
    Ok(pushed)
}

#[derive(Debug, Default)]
pub struct Pulled {
    /// Stages whose result came from the remote.
    pub pulled: Vec<String>,
    /// Stages whose result was here already.
    pub present: Vec<String>,
    /// Stages the lock file names that the remote did not give.
    pub missing: Vec<String>,
    /// Outputs rewritten in the workspace.
    pub restored: usize,
    /// Item outcomes brought with their stages.
    pub items: usize,
}

/// Brings the results the lock file names for the selected stages, and
/// the outcomes of their items where this checkout can plan them.
pub async fn pull(
    ctx: &mut Context<'_>,
    selected: &[bool],
    remote: &RemoteCache,
    invocation: &str,
) -> Result<Pulled, ScheduleError> {
    let (manifest, dag) = (ctx.manifest, ctx.dag);
    let lock = ctx
        .lock
        .clone()
        .unwrap_or_else(|| crate::store::LockFile::new(&manifest.name));
    let token = format!("{}-{}", std::process::id(), crate::store::now_ms());
    let manifest_digest = super::timeline::manifest_digest(manifest);
    let run_id = ledger(ctx)?.begin_run(
        invocation,
        manifest.profile.as_deref(),
        &token,
        &manifest_digest,
    )?;
    let origin = format!("remote:{}", remote.url());
    let mut pulled = Pulled::default();
    let mut stat = StatCache::default();
    for &i in dag.order() {
        if !selected[i] {
            continue;
        }
        let stage = &manifest.stages[i];
        let Some(locked) = lock.stages.get(&stage.name) else {
            pulled.missing.push(stage.name.clone());
            continue;
        };
        let local = ledger(ctx)?
            .find_ok(&stage.name, &locked.fingerprint)?
            .filter(|record| record.outputs.iter().all(|o| ctx.store.is_complete(o)));
        let outputs = match local {
            Some(record) => {
                pulled.present.push(stage.name.clone());
                record.outputs
            }
            None => {
                let Some(fetched) = remote.fetch(&locked.fingerprint, &ctx.store).await else {
                    pulled.missing.push(stage.name.clone());
                    continue;
                };
                let What::Stage { key } = &fetched.entry.what else {
                    pulled.missing.push(stage.name.clone());
                    continue;
                };
                let declared = are_declared(stage, &fetched.entry.outputs);
                if !declared || !matches_lock(&fetched.entry.outputs, locked) {
                    remote
                        .stats
                        .refused
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(
                        "the remote's result for `{}` has outputs other than the manifest declares and the lock file records; not taken",
                        stage.name
                    );
                    pulled.missing.push(stage.name.clone());
                    continue;
                }
                let producer = &fetched.entry.producer;
                ledger(ctx)?.record(
                    &NewResult {
                        run_id,
                        stage: &stage.name,
                        key,
                        status: ResultStatus::Ok,
                        outputs: &fetched.entry.outputs,
                        command: &stage.describe_run(),
                        started_ms: producer.started_ms,
                        finished_ms: producer.finished_ms,
                        exit_code: producer.exit_code,
                        log_path: None,
                        error: None,
                        attempt: None,
                        origin: Some(&origin),
                    },
                    &fetched.inline,
                )?;
                pulled.pulled.push(stage.name.clone());
                fetched.entry.outputs
            }
        };
        for output in &outputs {
            let abs = manifest.root.join(&output.path);
            if stat
                .content(&abs)
                .is_ok_and(|c| c.digest() == output.digest)
            {
                continue;
            }
            ctx.store.restore(output, &abs, ctx.ledger.as_ref())?;
            pulled.restored += 1;
        }
        ctx.note_outputs(&outputs);
        // Its items too, so that `status` counts them and an edit re-runs
        // only the items it reaches; skipped where the inputs that plan
        // them are not here.
        if stage.foreach.is_some()
            && ctx.key_of(i).is_ok()
            && let Some(mut plan) = ctx.take_item_plan(i)
        {
            let (record, mut recorded) = tokio::sync::mpsc::unbounded_channel();
            let item_outputs = ItemOutputs::of(stage, &manifest.root);
            let store = ctx.store.clone();
            pulled.items += reuse_items(
                remote,
                &mut plan,
                &item_outputs,
                &store,
                &record,
                run_id,
                &stage.name,
            )
            .await;
            drop(record);
            let mut attempts = Vec::new();
            while let Ok(attempt) = recorded.try_recv() {
                attempts.push(attempt);
            }
            ledger(ctx)?.record_item_attempts(&attempts)?;
        }
    }
    let counts = crate::store::RunCounts {
        restored: pulled.pulled.len(),
        fresh: pulled.present.len(),
        ..Default::default()
    };
    let status = if pulled.missing.is_empty() {
        "ok"
    } else {
        "failed"
    };
    // The pull's timeline: what became of each stage it selected.
    let mut timeline = Timeline::new(manifest, selected, dag.order());
    for &i in dag.order().iter().filter(|&&i| selected[i]) {
        let name = &manifest.stages[i].name;
        timeline.ready(i);
        if pulled.pulled.contains(name) {
            timeline.decided(
                i,
                StageState::Remote,
                Some(format!("pulled from {}", remote.url())),
            );
        } else if pulled.present.contains(name) {
            timeline.decided(i, StageState::Fresh, None);
        } else {
            timeline.ended(
                i,
                StageState::Failed,
                Some("no result of the lock file's fingerprint to pull".to_owned()),
            );
        }
    }
    ledger(ctx)?.record_stage_runs(run_id, &timeline.rows())?;
    ledger(ctx)?.finish_run(run_id, status, counts)?;
    Ok(pulled)
}

fn ledger<'c>(ctx: &'c Context<'_>) -> Result<&'c crate::store::Ledger, ScheduleError> {
    ctx.ledger.as_ref().ok_or(ScheduleError::NoLedger)
}

/// Whether `outputs` are exactly the outputs `locked` records.
fn matches_lock(outputs: &[OutputRecord], locked: &crate::store::LockedStage) -> bool {
    outputs.len() == locked.outputs.len()
        && outputs.iter().all(|output| {
            locked.outputs.get(&output.name).is_some_and(|l| {
                l.path == output.path
                    && l.digest == output.digest
                    && l.kind == output.kind
                    && (output.kind == OutputKind::Dir || l.size == output.size)
            })
        })
}

/// A one-line account of what a run, a push or a pull did with the remote.
pub fn remote_summary(remote: &RemoteCache) -> String {
    let stats = &remote.stats;
    let mut parts = vec![format!("{} reused", RemoteStats::count(&stats.hits))];
    let uploaded = RemoteStats::count(&stats.uploaded);
    if uploaded > 0 {
        parts.push(format!("{uploaded} uploaded"));
    }
    let refused = RemoteStats::count(&stats.refused);
    if refused > 0 {
        parts.push(format!("{refused} refused (see the warnings)"));
    }
    let failures = RemoteStats::count(&stats.upload_failures);
    if failures > 0 {
        parts.push(format!(
            "{failures} result(s) not uploaded (`cairn push` sends them later)"
        ));
    }
    // (Down is not unreachable: a server that answers 500 is down too.)
    if let Some(why) = remote.down_because() {
        parts.push(format!("not used after an error: {why}"));
    }
    format!("remote cache {}: {}", remote.url(), parts.join(", "))
}
