//! The run's side of a remote cache: looking items up before they run,
//! and uploading what this run validated, in the background.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt as _;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;

use super::item_outputs::ItemOutputs;
use super::items::PlannedItem;
use crate::fingerprint::{Digest, StageKey};
use crate::manifest::{ExecutorSpec, ItemClass, Manifest, Stage};
use crate::store::shared_cache::{
    ENTRY_FORMAT, Entry, Fetched, InlineBytes, Producer, RemoteCache, What,
};
use crate::store::{ItemAttempt, ObjectStore, OutputRecord, now_ms};

/// Item entries looked up at once.
const LOOKUPS_IN_FLIGHT: usize = 32;
/// Entries uploaded at once.
const UPLOADS_IN_FLIGHT: usize = 4;

/// Who made a result here: this cairn, this host, the stage's engine.
pub fn producer(
    manifest: &Manifest,
    stage: &Stage,
    started_ms: i64,
    finished_ms: i64,
    exit_code: Option<i32>,
) -> Producer {
    let executor = stage
        .executor
        .as_ref()
        .and_then(|named| manifest.executors.get(&named.name))
        .map_or("local", |spec| match spec {
            ExecutorSpec::Local => "local",
            ExecutorSpec::Slurm(_) => "slurm",
            ExecutorSpec::Kubernetes(_) => "kubernetes",
        });
    Producer {
        cairn: env!("CARGO_PKG_VERSION").to_owned(),
        host: host_name(),
        executor: executor.to_owned(),
        started_ms,
        finished_ms,
        exit_code,
    }
}

pub fn host_name() -> String {
    // Read once a process: every stage a run starts names it.
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default()
    })
    .clone()
}

/// Whether `outputs` are exactly `stage`'s declared outputs, by name and
/// path: a result taken from elsewhere writes nowhere else.
pub fn are_declared(stage: &Stage, outputs: &[OutputRecord]) -> bool {
    outputs.len() == stage.outputs.len()
        && outputs.iter().all(|o| {
            stage
                .outputs
                .iter()
                .any(|d| d.name == o.name && d.path.as_str() == o.path)
        })
}

/// The entry of a stage's result.
pub fn stage_entry(
    stage: &str,
    key: &StageKey,
    outputs: &[OutputRecord],
    producer: Producer,
) -> Entry {
    Entry {
        format: ENTRY_FORMAT.to_owned(),
        fingerprint: key.fingerprint(),
        stage: stage.to_owned(),
        what: What::Stage { key: key.clone() },
        outputs: outputs.to_vec(),
        blobs: Vec::new(),
        producer,
    }
}

/// The entry of an item's final outcome.
pub fn item_entry(
    stage: &str,
    planned: &PlannedItem,
    class: &ItemClass,
    rule: Option<String>,
    result: Option<String>,
    outputs: &[OutputRecord],
    producer: Producer,
) -> Entry {
    Entry {
        format: ENTRY_FORMAT.to_owned(),
        fingerprint: planned.fingerprint,
        stage: stage.to_owned(),
        what: What::Item {
            item: planned.item.key.clone(),
            code: *planned.code,
            canonical: planned.item.canonical.to_string(),
            inputs: planned.inputs.to_vec(),
            class: class.name().to_owned(),
            rule,
            result,
        },
        outputs: outputs.to_vec(),
        blobs: Vec::new(),
        producer,
    }
}

/// Uploads running beside the run: each entry after its blobs. Cloned
/// into every task that validates something.
#[derive(Clone)]
pub struct Uploads {
    queue: UnboundedSender<(Entry, InlineBytes)>,
    pending: Arc<AtomicUsize>,
}

/// The worker behind [`Uploads`], drained at the end of the run.
pub struct UploadWorker {
    handle: JoinHandle<()>,
    pending: Arc<AtomicUsize>,
}

impl Uploads {
    pub fn start(remote: Arc<RemoteCache>, store: ObjectStore) -> (Self, UploadWorker) {
        let (queue, mut received) = unbounded_channel::<(Entry, InlineBytes)>();
        let pending = Arc::new(AtomicUsize::new(0));
        let left = pending.clone();
        let handle = tokio::spawn(async move {
            let mut running = futures::stream::FuturesUnordered::new();
            loop {
                tokio::select! {
                    next = received.recv(), if running.len() < UPLOADS_IN_FLIGHT => match next {
                        Some((entry, inline)) => {
                            let (remote, store, left) = (remote.clone(), store.clone(), left.clone());
                            running.push(async move {
                                let fingerprint = entry.fingerprint;
                                if let Err(error) = remote.upload(entry, &store, inline).await {
                                    tracing::debug!(%fingerprint, "not uploaded: {error}");
                                }
                                left.fetch_sub(1, Ordering::Relaxed);
                            });
                        }
                        None if running.is_empty() => return,
                        None => {
                            while running.next().await.is_some() {}
                            return;
                        }
                    },
                    Some(()) = running.next(), if !running.is_empty() => {}
                }
            }
        });
        (
            Self {
                queue,
                pending: pending.clone(),
            },
            UploadWorker { handle, pending },
        )
    }

    pub fn send(&self, entry: Entry, inline: InlineBytes) {
        self.pending.fetch_add(1, Ordering::Relaxed);
        if self.queue.send((entry, inline)).is_err() {
            self.pending.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl UploadWorker {
    /// Waits up to `deadline` for the queued uploads (every [`Uploads`]
    /// must be dropped first); returns how many were left unfinished.
    /// (Dropped before it returns, it leaves the uploads to the runtime's
    /// end.)
    pub async fn drain(self, deadline: Duration) -> usize {
        let mut handle = self.handle;
        match tokio::time::timeout(deadline, &mut handle).await {
            Ok(_) => 0,
            Err(_) => {
                handle.abort();
                self.pending.load(Ordering::Relaxed)
            }
        }
    }
}

/// Looks the items of `plan` that have no final outcome up in the remote
/// (at most [`LOOKUPS_IN_FLIGHT`] at once), and takes each verified hit
/// as the item's outcome: its outputs are in the store, its attempt goes
/// on record with the remote as its origin. Returns how many were reused.
pub async fn reuse_items(
    remote: &RemoteCache,
    plan: &mut [PlannedItem],
    outputs: &ItemOutputs,
    store: &ObjectStore,
    record: &UnboundedSender<ItemAttempt>,
    run_id: i64,
    stage: &str,
) -> usize {
    let wanted: Vec<(usize, Digest)> = plan
        .iter()
        .enumerate()
        .filter(|(_, p)| !p.outcome.as_ref().is_some_and(|(c, _)| c.is_final()))
        .map(|(n, p)| (n, p.fingerprint))
        .collect();
    if wanted.is_empty() || !remote.is_up() {
        return 0;
    }
    let mut found = futures::stream::iter(
        wanted
            .into_iter()
            .map(|(n, fingerprint)| async move { (n, remote.fetch(&fingerprint, store).await) }),
    )
    .buffer_unordered(LOOKUPS_IN_FLIGHT);
    let origin = format!("remote:{}", remote.url());
    let mut reused = 0;
    while let Some((n, fetched)) = found.next().await {
        let Some(Fetched { entry, .. }) = fetched else {
            continue;
        };
        let What::Item {
            item,
            class,
            rule,
            result,
            ..
        } = entry.what
        else {
            continue;
        };
        let planned = &mut plan[n];
        let class = ItemClass::parse(&class);
        // Its outputs must be exactly this item's entries of the stage's
        // item outputs: nothing is restored anywhere else.
        let expected = outputs.paths(&planned.item).unwrap_or_default();
        // (An item that is not `ok` may have written only some of them.)
        let own = (class != ItemClass::Ok || entry.outputs.len() == expected.len())
            && entry.outputs.iter().all(|o| {
                expected
                    .iter()
                    .any(|(name, path, _)| *name == o.name && *path == o.path)
            });
        if item != planned.item.key || !class.is_final() || !own {
            continue;
        }
        let now = now_ms();
        let attempt = ItemAttempt {
            code: Some(*planned.code),
            class: class.name().to_owned(),
            rule,
            result: result.clone(),
            outputs: (!entry.outputs.is_empty()).then(|| entry.outputs.clone()),
            exit_code: entry.producer.exit_code,
            // Shown where a job's handle would be: where it came from.
            handle: Some(origin.clone()),
            origin: Some(origin.clone()),
            ..ItemAttempt::started(
                run_id,
                stage,
                &planned.item.key,
                planned.fingerprint,
                1,
                now,
            )
        };
        planned.outcome = Some((class, planned.attempts_before + 1));
        planned.outputs = attempt.outputs.clone().map(Vec::into_boxed_slice);
        planned.result = result.and_then(|text| serde_json::from_str(&text).ok());
        let _ = record.send(attempt);
        reused += 1;
    }
    reused
}
