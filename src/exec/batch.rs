//! Batches: jobs that differ only in their item coalesce into one engine job
//! with one index per item (a Slurm job array), so 50,000 items cost a few
//! hundred submissions instead of 50,000.
//!
//! A job joins the batch of the jobs that share its place, environment,
//! limits and image ([`batch_key`]); only the command and the per-index
//! variables ([`PER_INDEX`]) differ. A batch is submitted when it holds
//! `size` jobs, or `linger` after its first job joined, whichever comes
//! first: items that become ready together go together, and a retry goes
//! into a new, smaller batch.
//!
//! Before a batch is submitted, its record (its name and its jobs' names in
//! index order) is written under `cache/batches/`: a cairn process killed
//! between the submission and its attempt records finds, in the next run,
//! which batch index runs each job, and adopts it instead of submitting it
//! twice. Each index is still its own job to the scheduler: its own handle
//! (`slurm:1234_3`), outcome, log, attempt record, retry and cancellation.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{BoxFuture, ExecError, Job};
use crate::manifest::Command;

/// The variables that tell one index's command which item it runs: set per
/// index by the batch's script, so they never split a batch.
pub const PER_INDEX: [&str; 4] = [ITEM_MARKER, ATTEMPT_MARKER, SAMPLE_MARKER, SEED_MARKER];

/// The variable that tells an item's command which item it runs.
pub const ITEM_MARKER: &str = "CAIRN_ITEM";

/// The variable that tells a sample's command which sample of its item it
/// draws (0 to k − 1), in a sampled stage.
pub const SAMPLE_MARKER: &str = "CAIRN_SAMPLE";

/// The variable that holds the seed a sample is drawn with (the stage's
/// seed plus the sample's index).
pub const SEED_MARKER: &str = "CAIRN_SEED";

/// The variable that numbers an item's attempts (1 for its first ever
/// under its fingerprint), so a harness can record which attempt produced
/// a verdict.
pub const ATTEMPT_MARKER: &str = "CAIRN_ATTEMPT";

/// Batch records older than this are removed: their jobs have long left
/// the engine's memory.
const RECORD_LIFETIME: Duration = Duration::from_secs(14 * 24 * 3600);

/// Jobs submitted as one.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The engine job's name: the stage and a digest of its jobs' names.
    pub name: String,
    /// One per index, in index order.
    pub jobs: Vec<Job>,
}

/// Where a job runs within a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub batch: String,
    pub index: usize,
}

/// An engine that submits a batch as one job.
pub trait BatchEngine: Clone + Send + Sync + 'static {
    /// Submits `batch`; the engine's id of each index, in index order.
    fn submit_batch<'a>(
        &'a self,
        batch: &'a Batch,
    ) -> BoxFuture<'a, Result<Vec<String>, ExecError>>;

    /// Cancels one index (submitted for a job nobody waits for any more).
    fn cancel_index<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ExecError>>;
}

/// Collects jobs into batches and submits them.
#[derive(Debug)]
pub struct Batcher {
    size: usize,
    linger: Duration,
    /// Jobs waiting for their batch to be submitted, by batch key.
    pending: Mutex<HashMap<blake3::Hash, Vec<Queued>>>,
    /// Every job name a batch record places, loaded from `cache/batches/`
    /// when first asked, then kept up to date by this process.
    placed: tokio::sync::Mutex<Option<HashMap<String, Placed>>>,
}

#[derive(Debug)]
struct Queued {
    job: Job,
    reply: tokio::sync::oneshot::Sender<Result<(Placed, String), ExecError>>,
}

impl Batcher {
    /// Batches of at most `size` jobs, submitted at most `linger` after
    /// their first job joined.
    pub fn new(size: usize, linger: Duration) -> Arc<Self> {
        Arc::new(Self {
            size: size.max(1),
            linger,
            pending: Mutex::default(),
            placed: tokio::sync::Mutex::default(),
        })
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<blake3::Hash, Vec<Queued>>> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Submits `job` in a batch: where it was placed and the engine's id of
    /// its index, once the batch is submitted.
    pub async fn submit<E: BatchEngine>(
        self: &Arc<Self>,
        engine: &E,
        job: &Job,
    ) -> Result<(Placed, String), ExecError> {
        let key = batch_key(job);
        let (reply, placed) = tokio::sync::oneshot::channel();
        let full = {
            let mut pending = self.pending();
            let group = pending.entry(key).or_default();
            group.push(Queued {
                job: job.clone(),
                reply,
            });
            if group.len() >= self.size {
                pending.remove(&key)
            } else {
                if group.len() == 1 {
                    let (batcher, engine) = (self.clone(), engine.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(batcher.linger).await;
                        let due = batcher.pending().remove(&key);
                        if let Some(queued) = due {
                            batcher.flush(&engine, queued).await;
                        }
                    });
                }
                None
            }
        };
        if let Some(queued) = full {
            // Its own task: a submitter interrupted now does not stop the
            // batch of the others.
            let (batcher, engine) = (self.clone(), engine.clone());
            tokio::spawn(async move { batcher.flush(&engine, queued).await });
        }
        placed.await.map_err(|_| ExecError::Engine {
            engine: "batch",
            action: "submit",
            detail: "the batch was dropped before it was submitted".to_owned(),
        })?
    }

    /// Records and submits one batch, and tells each job where it went.
    async fn flush<E: BatchEngine>(&self, engine: &E, mut queued: Vec<Queued>) {
        // A job nobody waits for any more (its run was interrupted) is not
        // submitted.
        queued.retain(|q| !q.reply.is_closed());
        if queued.is_empty() {
            return;
        }
        let batch = Batch {
            name: batch_name(queued.iter().map(|q| &q.job)),
            jobs: queued.iter().map(|q| q.job.clone()).collect(),
        };
        let submitted = match self.record(&batch).await {
            Ok(()) => engine.submit_batch(&batch).await,
            Err(error) => Err(error),
        };
        match submitted {
            Ok(ids) if ids.len() == queued.len() => {
                for (index, (q, id)) in queued.into_iter().zip(ids).enumerate() {
                    let placed = Placed {
                        batch: batch.name.clone(),
                        index,
                    };
                    if q.reply.send(Ok((placed, id.clone()))).is_err() {
                        // Its waiter went away while the batch was submitted.
                        if let Err(error) = engine.cancel_index(&id).await {
                            tracing::warn!(job = %id, error = %error, "could not cancel a batch index nobody waits for");
                        }
                    }
                }
            }
            Ok(ids) => {
                let detail = format!(
                    "the engine gave {} ids for a batch of {}",
                    ids.len(),
                    queued.len()
                );
                for q in queued {
                    let _ = q.reply.send(Err(engine_error(&detail)));
                }
            }
            Err(error) => {
                // Every job of the batch fails as the submission did, in
                // the engine's own words.
                let (engine, detail) = match &error {
                    ExecError::Engine { engine, detail, .. } => (*engine, detail.clone()),
                    other => ("batch", other.to_string()),
                };
                for q in queued {
                    let _ = q.reply.send(Err(ExecError::Engine {
                        engine,
                        action: "submit",
                        detail: detail.clone(),
                    }));
                }
            }
        }
    }

    /// Writes the batch's record (temp file and rename) and adds it to
    /// what this process knows.
    async fn record(&self, batch: &Batch) -> Result<(), ExecError> {
        let dir = records_dir(&batch.jobs[0].cwd);
        let names: Vec<&str> = batch.jobs.iter().map(|j| j.name.as_str()).collect();
        let text = serde_json::json!({ "batch": batch.name, "jobs": names }).to_string();
        let path = dir.join(format!("{}.json", batch.name));
        let written = tokio::task::spawn_blocking(move || {
            let temp = path.with_extension("json.writing");
            std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(&temp, text))
                .and_then(|()| std::fs::rename(&temp, &path))
                .map_err(|source| ExecError::Write { path, source })
        })
        .await
        .map_err(|e| ExecError::Wait(std::io::Error::other(e)))?;
        written?;
        let mut placed = self.placed.lock().await;
        if let Some(placed) = placed.as_mut() {
            place(
                placed,
                &batch.name,
                batch.jobs.iter().map(|j| j.name.clone()),
            );
        }
        Ok(())
    }

    /// The batch index that runs the job named `job.name`, if a batch record
    /// (this process's or an earlier one's) places it.
    pub async fn placed(&self, job: &Job) -> Option<Placed> {
        let mut placed = self.placed.lock().await;
        if placed.is_none() {
            let dir = records_dir(&job.cwd);
            let loaded = tokio::task::spawn_blocking(move || load_records(&dir))
                .await
                .unwrap_or_default();
            *placed = Some(loaded);
        }
        placed.as_ref().and_then(|p| p.get(&job.name).cloned())
    }
}

fn engine_error(detail: &str) -> ExecError {
    ExecError::Engine {
        engine: "batch",
        action: "submit",
        detail: detail.to_owned(),
    }
}

/// Where batch records lie under the project root.
fn records_dir(root: &Path) -> PathBuf {
    crate::store::layout::batches(root)
}

/// Every job a record in `dir` places, the newest record winning; records
/// older than [`RECORD_LIFETIME`] are removed, unreadable ones skipped.
fn load_records(dir: &Path) -> HashMap<String, Placed> {
    let mut records: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    records.sort();
    let mut placed = HashMap::new();
    for (modified, path) in records {
        if modified.elapsed().is_ok_and(|age| age > RECORD_LIFETIME) {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let Ok(record) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            continue;
        };
        let (Some(batch), Some(jobs)) = (record["batch"].as_str(), record["jobs"].as_array())
        else {
            continue;
        };
        let names = jobs.iter().filter_map(|j| j.as_str().map(str::to_owned));
        place(&mut placed, batch, names);
    }
    placed
}

fn place(placed: &mut HashMap<String, Placed>, batch: &str, names: impl Iterator<Item = String>) {
    for (index, name) in names.enumerate() {
        let at = Placed {
            batch: batch.to_owned(),
            index,
        };
        placed.insert(name, at);
    }
}

/// What jobs of one batch share: everything but the command and the
/// per-index variables. Secret values are among it, so a secret never has
/// to be set per index (in a script an engine keeps).
pub fn batch_key(job: &Job) -> blake3::Hash {
    fn field(hasher: &mut blake3::Hasher, bytes: &[u8]) {
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    }
    let mut hasher = blake3::Hasher::new();
    let log_dir = job.log.parent().unwrap_or(Path::new(""));
    for part in [
        job.token.as_bytes(),
        job.stage.as_bytes(),
        job.cwd.as_os_str().as_encoded_bytes(),
        log_dir.as_os_str().as_encoded_bytes(),
        format!("{:?}", job.timeout).as_bytes(),
        job.image.as_deref().unwrap_or_default().as_bytes(),
    ] {
        field(&mut hasher, part);
    }
    let mut env: Vec<&(String, String)> = job
        .env
        .iter()
        .filter(|(name, _)| !PER_INDEX.contains(&name.as_str()))
        .collect();
    env.sort();
    for (name, value) in env.into_iter().chain(&job.redact) {
        field(&mut hasher, name.as_bytes());
        field(&mut hasher, value.as_bytes());
    }
    hasher.finalize()
}

/// `cairn-STAGE-batch-DIGEST`, the digest of the jobs' names in order: the
/// same jobs give the same name.
fn batch_name<'a>(jobs: impl Iterator<Item = &'a Job>) -> String {
    let mut hasher = blake3::Hasher::new();
    let mut stage = None;
    for job in jobs {
        stage.get_or_insert_with(|| job.stage.clone());
        hasher.update(job.name.as_bytes());
        hasher.update(b"\n");
    }
    let digest = hasher.finalize().to_hex();
    format!(
        "cairn-{}-batch-{}",
        stage.unwrap_or_default(),
        &digest.as_str()[..16]
    )
}

/// The batch's script: index `i` (in variable `index_var`, which the
/// engine sets) sets job `i`'s per-index variables (its item and attempt)
/// and runs its command. Every value is quoted as one word; secrets are
/// never among them (a batch shares its secrets, which travel as the
/// engine passes any job's).
pub fn index_script(batch: &Batch, index_var: &str) -> String {
    use crate::manifest::shell::quote_word;
    let mut script = format!("#!/bin/sh\ncase \"${index_var}\" in\n");
    for (index, job) in batch.jobs.iter().enumerate() {
        script.push_str(&format!("{index})\n"));
        let exports: Vec<String> = per_index_env(job)
            .map(|(name, value)| format!("{name}={}", quote_word(value)))
            .collect();
        if !exports.is_empty() {
            script.push_str(&format!("  export {}\n", exports.join(" ")));
        }
        script.push_str(&format!("  {}\n  ;;\n", exec_line(&job.command)));
    }
    script.push_str(&format!(
        "*)\n  echo {} \"${index_var}\" >&2\n  exit 125\n  ;;\nesac\n",
        quote_word(&format!("cairn: batch {} has no index", batch.name))
    ));
    script
}

/// The shell line that replaces the shell with `command`.
pub fn exec_line(command: &Command) -> String {
    use crate::manifest::shell::quote_word;
    match command {
        Command::Shell(script) => format!("exec /bin/sh -c {}", quote_word(script)),
        Command::Exec(argv) => {
            let words: Vec<String> = argv.iter().map(|w| quote_word(w)).collect();
            format!("exec {}", words.join(" "))
        }
    }
}

/// The per-index variables of `job`, to be set by the batch's script.
pub fn per_index_env(job: &Job) -> impl Iterator<Item = &(String, String)> {
    job.env
        .iter()
        .filter(|(name, _)| PER_INDEX.contains(&name.as_str()))
}

/// The environment every index of `batch` shares.
pub fn shared_env(batch: &Batch) -> impl Iterator<Item = &(String, String)> {
    batch.jobs[0]
        .env
        .iter()
        .filter(|(name, _)| !PER_INDEX.contains(&name.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(root: &Path, item: &str) -> Job {
        Job {
            name: format!("cairn-work-abcd-{item}-1"),
            token: "1-2".to_owned(),
            stage: "work".to_owned(),
            command: Command::Shell(format!("echo {item}")),
            cwd: root.to_owned(),
            env: vec![
                ("PATH".to_owned(), "/usr/bin".to_owned()),
                (ITEM_MARKER.to_owned(), item.to_owned()),
                (ATTEMPT_MARKER.to_owned(), "1".to_owned()),
            ],
            timeout: None,
            log: root.join(format!("cache/logs/{item}.1.log")),
            redact: Vec::new(),
            secrets: Vec::new(),
            image: None,
        }
    }

    /// Submits each batch as indices `BATCH#0`, `BATCH#1`, …, counting them.
    #[derive(Clone, Default)]
    struct Counting {
        batches: Arc<Mutex<Vec<Vec<String>>>>,
    }

    impl BatchEngine for Counting {
        fn submit_batch<'a>(
            &'a self,
            batch: &'a Batch,
        ) -> BoxFuture<'a, Result<Vec<String>, ExecError>> {
            Box::pin(async move {
                let names: Vec<String> = batch.jobs.iter().map(|j| j.name.clone()).collect();
                self.batches.lock().unwrap().push(names);
                Ok((0..batch.jobs.len())
                    .map(|i| format!("{}#{i}", batch.name))
                    .collect())
            })
        }

        fn cancel_index<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), ExecError>> {
            Box::pin(async { Ok(()) })
        }
    }

    #[test]
    fn a_batchs_script_runs_each_index_as_its_item_with_every_value_quoted() {
        let root = Path::new("/r");
        let mut hostile = job(root, "a");
        hostile.env.retain(|(name, _)| name == "PATH");
        hostile.command = Command::Shell("echo $CAIRN_ITEM".to_owned());
        hostile
            .env
            .push(("CAIRN_ITEM".to_owned(), "x'; rm -rf / #".to_owned()));
        hostile
            .env
            .push(("CAIRN_ATTEMPT".to_owned(), "2".to_owned()));
        let mut plain = job(root, "b");
        plain.env.retain(|(name, _)| name == "PATH");
        plain.command = Command::Exec(vec!["python3".into(), "a b.py".into()]);
        plain.env.push(("CAIRN_ITEM".to_owned(), "b".to_owned()));
        plain.env.push(("CAIRN_ATTEMPT".to_owned(), "1".to_owned()));
        let batch = Batch {
            name: "cairn-oracle-batch-0011".to_owned(),
            jobs: vec![hostile, plain],
        };
        assert_eq!(
            index_script(&batch, "SLURM_ARRAY_TASK_ID"),
            "#!/bin/sh\ncase \"$SLURM_ARRAY_TASK_ID\" in\n\
             0)\n  export CAIRN_ITEM='x'\\''; rm -rf / #' CAIRN_ATTEMPT=2\n  exec /bin/sh -c 'echo $CAIRN_ITEM'\n  ;;\n\
             1)\n  export CAIRN_ITEM=b CAIRN_ATTEMPT=1\n  exec python3 'a b.py'\n  ;;\n\
             *)\n  echo 'cairn: batch cairn-oracle-batch-0011 has no index' \"$SLURM_ARRAY_TASK_ID\" >&2\n  exit 125\n  ;;\nesac\n"
        );
        // Run as Slurm runs it: index 0 is the hostile item, as data.
        let out = std::process::Command::new("/bin/sh")
            .args(["-c", &index_script(&batch, "SLURM_ARRAY_TASK_ID")])
            .env("SLURM_ARRAY_TASK_ID", "0")
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "x'; rm -rf / #\n");
        // The shared environment is what sbatch runs with: no per-index
        // variable in it.
        let shared: Vec<&str> = shared_env(&batch).map(|(n, _)| n.as_str()).collect();
        assert_eq!(shared, ["PATH"]);
    }

    #[test]
    fn only_the_per_index_variables_and_the_command_may_differ_within_a_batch() {
        let root = Path::new("/r");
        let (a, b) = (job(root, "a"), job(root, "b"));
        assert_eq!(batch_key(&a), batch_key(&b));
        let mut other_env = b.clone();
        other_env.env.push(("MODEL".to_owned(), "m2".to_owned()));
        assert_ne!(batch_key(&a), batch_key(&other_env));
        let mut other_secret = b.clone();
        other_secret
            .redact
            .push(("TOKEN".to_owned(), "s3cret".to_owned()));
        assert_ne!(batch_key(&a), batch_key(&other_secret));
        let mut other_timeout = b.clone();
        other_timeout.timeout = Some(Duration::from_secs(9));
        assert_ne!(batch_key(&a), batch_key(&other_timeout));
        let mut other_image = b;
        other_image.image = Some("r/x@sha256:00".to_owned());
        assert_ne!(batch_key(&a), batch_key(&other_image));
    }

    #[tokio::test(start_paused = true)]
    async fn jobs_ready_together_share_batches_of_at_most_size() {
        let dir = tempfile::tempdir().unwrap();
        let batcher = Batcher::new(4, Duration::from_millis(100));
        let engine = Counting::default();
        let mut waiting = tokio::task::JoinSet::new();
        for i in 0..10 {
            let (batcher, engine, job) = (
                batcher.clone(),
                engine.clone(),
                job(dir.path(), &format!("i{i}")),
            );
            waiting.spawn(async move { batcher.submit(&engine, &job).await.unwrap() });
        }
        let mut placed = Vec::new();
        while let Some(joined) = waiting.join_next().await {
            placed.push(joined.unwrap());
        }
        let sizes: Vec<usize> = engine
            .batches
            .lock()
            .unwrap()
            .iter()
            .map(Vec::len)
            .collect();
        // Two full batches at once, the rest when the linger ran out.
        assert_eq!(sizes, [4, 4, 2]);
        // Each job's index is its place in its batch, and its id the
        // engine's for that index.
        for (at, id) in &placed {
            assert_eq!(*id, format!("{}#{}", at.batch, at.index));
        }
    }

    #[tokio::test]
    async fn a_later_process_finds_where_a_batch_placed_each_job() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Counting::default();
        let first = Batcher::new(2, Duration::from_millis(10));
        let (a, b) = (job(dir.path(), "a"), job(dir.path(), "b"));
        let (placed_a, placed_b) =
            tokio::join!(first.submit(&engine, &a), first.submit(&engine, &b));
        let (placed_a, placed_b) = (placed_a.unwrap().0, placed_b.unwrap().0);
        assert_eq!(first.placed(&a).await, Some(placed_a.clone()));

        let later = Batcher::new(2, Duration::from_millis(10));
        assert_eq!(later.placed(&a).await, Some(placed_a));
        assert_eq!(later.placed(&b).await, Some(placed_b));
        assert_eq!(later.placed(&job(dir.path(), "c")).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_whose_waiter_left_is_not_submitted() {
        let dir = tempfile::tempdir().unwrap();
        let batcher = Batcher::new(8, Duration::from_millis(100));
        let engine = Counting::default();
        let gone = {
            let (batcher, engine, job) = (batcher.clone(), engine.clone(), job(dir.path(), "gone"));
            tokio::spawn(async move { batcher.submit(&engine, &job).await })
        };
        // Until it has joined a batch.
        while batcher.pending().is_empty() {
            tokio::task::yield_now().await;
        }
        gone.abort();
        let kept = batcher
            .submit(&engine, &job(dir.path(), "kept"))
            .await
            .unwrap();
        assert_eq!(kept.0.index, 0);
        assert_eq!(
            *engine.batches.lock().unwrap(),
            [vec!["cairn-work-abcd-kept-1".to_owned()]]
        );
    }
}
