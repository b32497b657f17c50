//! The Kubernetes executor: creates, finds, watches and deletes Jobs
//! through an injected `kube::Client` (or the default kubeconfig /
//! in-cluster configuration, found the first time a job needs it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::batch::v1::Job as KubeJob;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams, WatchEvent, WatchParams};
use tokio::sync::{OnceCell, OwnedSemaphorePermit, Semaphore};

use super::engine_error;
use super::spec::{INDEX_LABEL, indexed_job_spec, job_spec, kubernetes_name};
use super::status::{
    JobState, PodSignal, ended_pod_outcome, job_state, passed_its_deadline, pod_signal,
};
use crate::exec::batch::{Batch, BatchEngine, Batcher, Placed};
use crate::exec::{
    BoxFuture, ClusterJobGuard, ExecError, Executor, HeldWindow, InfraKind, Job, Outcome, Running,
    redact_log,
};
use crate::manifest::KubernetesSettings;

/// How long one watch request stays open before it is renewed (the API
/// server's own limit is larger; a renewal lists once, then watches again).
const WATCH_SECONDS: u32 = 290;
/// How long an interrupted run waits for one Job's deletion.
const CANCEL_LIMIT: Duration = Duration::from_secs(10);

/// At most `qps` requests a second (a watch counts once, when it starts):
/// the layer an executor with `qps` puts over its connection.
pub fn qps_limit(qps: u32) -> tower::limit::RateLimitLayer {
    tower::limit::RateLimitLayer::new(u64::from(qps.max(1)), Duration::from_secs(1))
}

#[derive(Clone)]
pub struct KubernetesExecutor {
    settings: Arc<KubernetesSettings>,
    client: Arc<OnceCell<Client>>,
    /// One permit per Job (or index of an Indexed Job) created and not yet
    /// ended (`max_jobs`).
    in_flight: Arc<Semaphore>,
    /// Gathers items into Indexed Jobs when `batch` is above 1.
    batcher: Option<Arc<Batcher>>,
    /// The Indexed Jobs this process waits on, by name: shared by the
    /// waiters of their indices.
    indexed: Arc<Mutex<HashMap<String, Weak<IndexedJob>>>>,
}

/// How long an Indexed Job waits for more items after its first, unless it
/// fills first.
const BATCH_LINGER: Duration = Duration::from_millis(100);

impl std::fmt::Debug for KubernetesExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesExecutor")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl KubernetesExecutor {
    /// An executor that connects through the default kubeconfig (or the
    /// in-cluster service account) when its first job starts.
    pub fn new(settings: KubernetesSettings) -> Self {
        let permits = settings.max_jobs.clamp(1, Semaphore::MAX_PERMITS);
        let batcher = (settings.batch > 1).then(|| Batcher::new(settings.batch, BATCH_LINGER));
        Self {
            settings: Arc::new(settings),
            client: Arc::new(OnceCell::new()),
            in_flight: Arc::new(Semaphore::new(permits)),
            batcher,
            indexed: Arc::default(),
        }
    }

    /// An executor that talks through `client`.
    pub fn with_client(settings: KubernetesSettings, client: Client) -> Self {
        Self {
            client: Arc::new(OnceCell::new_with(Some(client))),
            ..Self::new(settings)
        }
    }

    async fn client(&self) -> Result<Client, ExecError> {
        let unreachable = |e: &dyn std::fmt::Display| {
            engine_error(
                "reach the cluster to start",
                format!(
                    "no usable kubeconfig (KUBECONFIG, ~/.kube/config) or in-cluster configuration: {e}"
                ),
            )
        };
        self.client
            .get_or_try_init(|| async {
                crate::tls::install_provider();
                let config = kube::Config::infer().await.map_err(|e| unreachable(&e))?;
                let builder =
                    kube::client::ClientBuilder::try_from(config).map_err(|e| unreachable(&e))?;
                Ok(match self.settings.qps {
                    Some(qps) => builder.with_layer(&qps_limit(qps)).build(),
                    None => builder.build(),
                })
            })
            .await
            .cloned()
    }

    async fn apis(&self) -> Result<(Api<KubeJob>, Api<Pod>), ExecError> {
        let client = self.client().await?;
        let namespace = &self.settings.namespace;
        Ok((
            Api::namespaced(client.clone(), namespace),
            Api::namespaced(client, namespace),
        ))
    }

    async fn room(&self) -> Result<OwnedSemaphorePermit, ExecError> {
        self.in_flight
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| ExecError::Wait(std::io::Error::other(e)))
    }

    /// The Indexed Job `name` as this process's waiters of its indices
    /// share it.
    fn indexed_job(&self, name: &str, jobs: &Api<KubeJob>) -> Arc<IndexedJob> {
        let mut indexed = self
            .indexed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        indexed.retain(|_, owner| owner.strong_count() > 0);
        if let Some(shared) = indexed.get(name).and_then(Weak::upgrade) {
            return shared;
        }
        let shared = Arc::new(IndexedJob {
            jobs: jobs.clone(),
            name: name.to_owned(),
            interrupted: AtomicBool::new(false),
            held: Mutex::new(Some(ClusterJobGuard::new())),
        });
        indexed.insert(name.to_owned(), Arc::downgrade(&shared));
        shared
    }

    /// The waiter of `job`'s Job, or (`placed`) of its index of an Indexed
    /// Job.
    fn running(
        &self,
        job: &Job,
        placed: Option<&Placed>,
        uid: Option<String>,
        jobs: Api<KubeJob>,
        pods: Api<Pod>,
        permit: OwnedSemaphorePermit,
    ) -> Box<dyn Running> {
        let (name, index) = match placed {
            None => (kubernetes_name(&job.name), None),
            Some(placed) => {
                let name = kubernetes_name(&placed.batch);
                let shared = self.indexed_job(&name, &jobs);
                (name, Some((placed.index, shared)))
            }
        };
        Box::new(KubernetesRunning {
            name,
            index,
            uid,
            jobs,
            pods,
            settings: self.settings.clone(),
            timeout: job.timeout,
            log: job.log.clone(),
            redact: job.redact.clone(),
            ended: false,
            _permit: permit,
            held: Some(ClusterJobGuard::new()),
        })
    }
}

impl Executor for KubernetesExecutor {
    fn kind(&self) -> &'static str {
        "kubernetes"
    }

    fn submit<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Box<dyn Running>, ExecError>> {
        Box::pin(async move {
            let permit = self.room().await?;
            let (jobs, pods) = self.apis().await?;
            if let Some(batcher) = &self.batcher {
                let (placed, _) = batcher.submit(self, job).await?;
                return Ok(self.running(job, Some(&placed), None, jobs, pods, permit));
            }
            let object = job_spec(job, &self.settings).map_err(|e| ExecError::Engine {
                engine: "kubernetes",
                action: "describe a job",
                detail: format!("the Job for `{}` is not valid: {e}", job.name),
            })?;
            let created = match jobs.create(&PostParams::default(), &object).await {
                Ok(created) => Some(created),
                // The same name is the same attempt: an earlier cairn
                // process created it; wait for that one.
                Err(kube::Error::Api(status)) if status.is_already_exists() => {
                    tracing::info!(job = %job.name, "adopted a job that already exists");
                    jobs.get_opt(&kubernetes_name(&job.name))
                        .await
                        .map_err(|e| engine_error("find a job", e))?
                }
                Err(e) => return Err(engine_error("submit", e)),
            };
            let uid = created.and_then(|j| j.metadata.uid);
            Ok(self.running(job, None, uid, jobs, pods, permit))
        })
    }

    fn hold_window<'a>(
        &'a self,
        window: &'a str,
        job: &'a Job,
    ) -> BoxFuture<'a, Result<Option<Box<dyn HeldWindow>>, ExecError>> {
        Box::pin(async move {
            let client = self.client().await?;
            super::lease::hold(client, &self.settings.namespace, window, &job.token)
                .await
                .map(Some)
        })
    }

    fn cancel_handle<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<bool, ExecError>> {
        Box::pin(async move {
            let Some((namespace, name)) = handle
                .strip_prefix("kubernetes:")
                .and_then(|rest| rest.split_once('/'))
            else {
                return Ok(false);
            };
            let client = self.client().await?;
            if let Some((name, index)) = name.split_once('#') {
                let pods: Api<Pod> = Api::namespaced(client, namespace);
                return delete_index(&pods, name, index).await.map(|()| true);
            }
            let jobs: Api<KubeJob> = Api::namespaced(client, namespace);
            delete(&jobs, name).await.map(|()| true)
        })
    }

    fn attach<'a>(
        &'a self,
        job: &'a Job,
    ) -> BoxFuture<'a, Result<Option<Box<dyn Running>>, ExecError>> {
        Box::pin(async move {
            let permit = self.room().await?;
            let (jobs, pods) = self.apis().await?;
            if let Some(batcher) = &self.batcher {
                // An Indexed Job is named after its batch: the batch
                // records say which index runs this job.
                let Some(placed) = batcher.placed(job).await else {
                    return Ok(None);
                };
                let found = jobs
                    .get_opt(&kubernetes_name(&placed.batch))
                    .await
                    .map_err(|e| engine_error("find a job", e))?;
                return Ok(found.map(|found| {
                    self.running(job, Some(&placed), found.metadata.uid, jobs, pods, permit)
                }));
            }
            let found = jobs
                .get_opt(&kubernetes_name(&job.name))
                .await
                .map_err(|e| engine_error("find a job", e))?;
            Ok(found.map(|found| self.running(job, None, found.metadata.uid, jobs, pods, permit)))
        })
    }
}

impl BatchEngine for KubernetesExecutor {
    fn submit_batch<'a>(
        &'a self,
        batch: &'a Batch,
    ) -> BoxFuture<'a, Result<Vec<String>, ExecError>> {
        Box::pin(async move {
            let (jobs, _) = self.apis().await?;
            let object =
                indexed_job_spec(batch, &self.settings).map_err(|e| ExecError::Engine {
                    engine: "kubernetes",
                    action: "describe a job",
                    detail: format!("the Indexed Job `{}` is not valid: {e}", batch.name),
                })?;
            match jobs.create(&PostParams::default(), &object).await {
                Ok(_) => {}
                // The same name is the same batch: an earlier process
                // created it.
                Err(kube::Error::Api(status)) if status.is_already_exists() => {}
                Err(e) => return Err(engine_error("submit", e)),
            }
            let name = kubernetes_name(&batch.name);
            Ok((0..batch.jobs.len())
                .map(|i| format!("{name}#{i}"))
                .collect())
        })
    }

    fn cancel_index<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ExecError>> {
        Box::pin(async move {
            let (_, pods) = self.apis().await?;
            let (name, index) = id.split_once('#').unwrap_or((id, "0"));
            delete_index(&pods, name, index).await
        })
    }
}

/// Deletes the pods of one index of an Indexed Job: with
/// `backoffLimitPerIndex: 0` the index then fails, and the others run on.
async fn delete_index(pods: &Api<Pod>, job: &str, index: &str) -> Result<(), ExecError> {
    let selector = format!("job-name={job},{INDEX_LABEL}={index}");
    let listed = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| engine_error("cancel a job", e))?;
    for pod in listed.items {
        let Some(name) = pod.metadata.name else {
            continue;
        };
        match pods.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            Err(e) => return Err(engine_error("cancel a job", e)),
        }
    }
    Ok(())
}

/// An Indexed Job this process waits on, shared by its indices' waiters:
/// once the last is dropped, the Job is deleted if any was dropped before
/// its index ended (an interrupted run), unless the run detached.
struct IndexedJob {
    jobs: Api<KubeJob>,
    name: String,
    interrupted: AtomicBool,
    /// Released once the deletion was sent (or was not needed).
    held: Mutex<Option<ClusterJobGuard>>,
}

impl Drop for IndexedJob {
    fn drop(&mut self) {
        let held = self
            .held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if self.interrupted.load(Ordering::SeqCst) && !super::super::cluster_jobs_detached() {
            delete_when_dropped(self.jobs.clone(), self.name.clone(), held);
        }
    }
}

/// A Job on the cluster. Dropped before it ended (the run was
/// interrupted), it is deleted; a cairn process killed outright leaves it
/// running, for the next run to adopt.
struct KubernetesRunning {
    /// The Job's name (an Indexed Job's, for an index).
    name: String,
    /// Which index of an Indexed Job this is, and that Job.
    index: Option<(usize, Arc<IndexedJob>)>,
    /// The Job's uid, which its pods carry (`controller-uid`): a Job of the
    /// same name created earlier may still have pods terminating.
    uid: Option<String>,
    jobs: Api<KubeJob>,
    pods: Api<Pod>,
    settings: Arc<KubernetesSettings>,
    timeout: Option<Duration>,
    log: std::path::PathBuf,
    redact: Vec<(String, String)>,
    ended: bool,
    _permit: OwnedSemaphorePermit,
    /// Released once the Job ended or its deletion was sent.
    held: Option<ClusterJobGuard>,
}

/// Deletes the Job and, in the background, its pod.
async fn delete(jobs: &Api<KubeJob>, name: &str) -> Result<(), ExecError> {
    match jobs.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(e) => Err(engine_error("cancel a job", e)),
    }
}

impl Drop for KubernetesRunning {
    fn drop(&mut self) {
        if self.ended || super::super::cluster_jobs_detached() {
            return;
        }
        // An index leaves its Job to the last of its batch's waiters.
        if let Some((_, shared)) = &self.index {
            shared.interrupted.store(true, Ordering::SeqCst);
            return;
        }
        delete_when_dropped(self.jobs.clone(), self.name.clone(), self.held.take());
    }
}

/// Deletes the Job `name` of a run being interrupted; `held` is released
/// once the deletion was sent.
fn delete_when_dropped(jobs: Api<KubeJob>, name: String, held: Option<ClusterJobGuard>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(job = %name, "an interrupted job was left running: no runtime to delete it on");
        return;
    };
    let delete = async move {
        let _held = held;
        match tokio::time::timeout(CANCEL_LIMIT, delete(&jobs, &name)).await {
            Ok(Ok(())) => tracing::debug!(job = %name, "deleted an interrupted job"),
            Ok(Err(e)) => {
                tracing::warn!(job = %name, error = %e, "could not delete an interrupted job")
            }
            Err(_) => tracing::warn!(job = %name, "deleting an interrupted job took too long"),
        }
    };
    match runtime.runtime_flavor() {
        // Delete before returning (briefly blocking, like `scancel`).
        tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| runtime.block_on(delete));
        }
        // The scheduler's own runtime: an interrupted run waits until
        // this deletion is done (`cluster_jobs_released`) before exiting.
        _ => {
            runtime.spawn(delete);
        }
    }
}

impl Running for KubernetesRunning {
    fn handle(&self) -> String {
        match &self.index {
            Some((index, _)) => {
                format!(
                    "kubernetes:{}/{}#{index}",
                    self.settings.namespace, self.name
                )
            }
            None => format!("kubernetes:{}/{}", self.settings.namespace, self.name),
        }
    }

    fn wait(self: Box<Self>) -> BoxFuture<'static, Result<Outcome, ExecError>> {
        Box::pin(async move {
            let mut this = self;
            let (outcome, pod) = this.watch().await?;
            this.ended = true;
            if let Some(pod) = pod {
                this.collect_log(&pod).await?;
            }
            Ok(outcome)
        })
    }
}

impl KubernetesRunning {
    fn pod_selector(&self) -> String {
        let job = match &self.uid {
            Some(uid) => format!("controller-uid={uid}"),
            None => format!("job-name={}", self.name),
        };
        match &self.index {
            Some((index, _)) => format!("{job},{INDEX_LABEL}={index}"),
            None => job,
        }
    }

    /// Watches the Job and its pod until the Job ends (or the pod says it
    /// never will); how it ended and the pod's name, if it had one.
    async fn watch(&mut self) -> Result<(Outcome, Option<String>), ExecError> {
        let mut unschedulable_since: Option<tokio::time::Instant> = None;
        let mut pod_name: Option<String> = None;
        loop {
            // A fresh look, then a watch from exactly that point.
            let Some(current) = self
                .jobs
                .get_opt(&self.name)
                .await
                .map_err(|e| engine_error("read a job's state", e))?
            else {
                return Ok((Outcome::Infra(InfraKind::Vanished), pod_name));
            };
            if let Some(outcome) = self.job_outcome(&current, &mut pod_name).await? {
                return Ok((outcome, pod_name));
            }
            let listed = self
                .pods
                .list(&ListParams::default().labels(&self.pod_selector()))
                .await
                .map_err(|e| engine_error("read a job's state", e))?;
            for pod in &listed.items {
                if let Some(outcome) = self
                    .on_pod(pod, &mut unschedulable_since, &mut pod_name)
                    .await?
                {
                    return Ok((outcome, pod_name));
                }
            }
            let job_version = current
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default();
            let pod_version = listed.metadata.resource_version.clone().unwrap_or_default();
            let job_events = self
                .jobs
                .watch(
                    &WatchParams::default()
                        .fields(&format!("metadata.name={}", self.name))
                        .timeout(WATCH_SECONDS),
                    &job_version,
                )
                .await
                .map_err(|e| engine_error("watch a job", e))?
                .map_ok(Either::Job);
            let pod_events = self
                .pods
                .watch(
                    &WatchParams::default()
                        .labels(&self.pod_selector())
                        .timeout(WATCH_SECONDS),
                    &pod_version,
                )
                .await
                .map_err(|e| engine_error("watch a job", e))?
                .map_ok(Either::Pod);
            let mut events = futures::stream::select(job_events.boxed(), pod_events.boxed());
            loop {
                let deadline =
                    unschedulable_since.map(|since| since + self.settings.unschedulable_timeout);
                let event = tokio::select! {
                    event = events.next() => event,
                    () = sleep_until(deadline) => {
                        delete(&self.jobs, &self.name).await?;
                        return Ok((Outcome::Infra(InfraKind::Unschedulable), pod_name));
                    }
                };
                let event = match event {
                    // The watch expired: look again and watch anew.
                    None => break,
                    Some(Err(e)) => return Err(engine_error("watch a job", e)),
                    Some(Ok(event)) => event,
                };
                match event {
                    Either::Job(WatchEvent::Added(job) | WatchEvent::Modified(job)) => {
                        if let Some(outcome) = self.job_outcome(&job, &mut pod_name).await? {
                            return Ok((outcome, pod_name));
                        }
                    }
                    // Someone deleted the Job before it ended.
                    Either::Job(WatchEvent::Deleted(_)) => {
                        return Ok((Outcome::Cancelled, pod_name));
                    }
                    Either::Pod(WatchEvent::Added(pod) | WatchEvent::Modified(pod)) => {
                        if let Some(outcome) = self
                            .on_pod(&pod, &mut unschedulable_since, &mut pod_name)
                            .await?
                        {
                            return Ok((outcome, pod_name));
                        }
                    }
                    // 410 Gone (the version is too old) and the like: start over.
                    Either::Job(WatchEvent::Error(_)) | Either::Pod(WatchEvent::Error(_)) => break,
                    Either::Job(WatchEvent::Bookmark(_)) | Either::Pod(_) => {}
                }
            }
        }
    }

    /// The Job's outcome once it has ended: a failure is explained by its pod.
    async fn job_outcome(
        &self,
        job: &KubeJob,
        pod_name: &mut Option<String>,
    ) -> Result<Option<Outcome>, ExecError> {
        match job_state(job) {
            JobState::Active => Ok(None),
            JobState::Complete => {
                if pod_name.is_none() {
                    *pod_name = self.latest_pod().await?.and_then(|p| p.metadata.name);
                }
                Ok(Some(Outcome::Success))
            }
            JobState::Failed(Some(reason)) if reason == "DeadlineExceeded" => {
                if pod_name.is_none() {
                    *pod_name = self.latest_pod().await?.and_then(|p| p.metadata.name);
                }
                Ok(Some(Outcome::TimedOut(self.timeout.unwrap_or_default())))
            }
            JobState::Failed(_) => Ok(Some(match self.latest_pod().await? {
                Some(pod) => {
                    *pod_name = pod.metadata.name.clone();
                    self.timed_out_or(&pod, ended_pod_outcome(&pod))
                }
                None => Outcome::Infra(InfraKind::Unknown),
            })),
        }
    }

    async fn on_pod(
        &self,
        pod: &Pod,
        unschedulable_since: &mut Option<tokio::time::Instant>,
        pod_name: &mut Option<String>,
    ) -> Result<Option<Outcome>, ExecError> {
        if pod.metadata.name.is_some() {
            pod_name.clone_from(&pod.metadata.name);
        }
        match pod_signal(pod) {
            PodSignal::Quiet => {
                *unschedulable_since = None;
                Ok(None)
            }
            PodSignal::Unschedulable => {
                unschedulable_since.get_or_insert_with(tokio::time::Instant::now);
                Ok(None)
            }
            // An image that cannot be pulled never will be: the Job would
            // wait forever.
            PodSignal::Ended(outcome @ Outcome::Infra(InfraKind::ImagePull)) => {
                delete(&self.jobs, &self.name).await?;
                Ok(Some(outcome))
            }
            PodSignal::Ended(outcome) => Ok(Some(self.timed_out_or(pod, outcome))),
        }
    }

    /// A pod stopped at its own deadline (an Indexed Job's pods carry the
    /// stage's timeout) timed out; any other keeps `outcome`.
    fn timed_out_or(&self, pod: &Pod, outcome: Outcome) -> Outcome {
        if passed_its_deadline(pod) {
            Outcome::TimedOut(self.timeout.unwrap_or_default())
        } else {
            outcome
        }
    }

    /// The Job's newest pod (there is one: `backoffLimit` is 0).
    async fn latest_pod(&self) -> Result<Option<Pod>, ExecError> {
        let listed = self
            .pods
            .list(&ListParams::default().labels(&self.pod_selector()))
            .await
            .map_err(|e| engine_error("read a job's state", e))?;
        Ok(listed
            .items
            .into_iter()
            .max_by_key(|p| p.metadata.creation_timestamp.clone()))
    }

    /// Appends the pod's log to the job's log, then redacts it.
    async fn collect_log(&self, pod: &str) -> Result<(), ExecError> {
        use std::io::Write as _;
        let text = match self.pods.logs(pod, &LogParams::default()).await {
            Ok(text) => text,
            // A pod that never started has no log; that is not an error.
            Err(e) => format!("[cairn: no log from pod {pod}: {e}]\n"),
        };
        let log_error = |source| ExecError::Log {
            path: self.log.clone(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(log_error)?;
        file.write_all(text.as_bytes()).map_err(log_error)?;
        drop(file);
        redact_log(&self.log, &self.redact).await.map_err(log_error)
    }
}

/// An event of either watch.
#[expect(
    clippy::large_enum_variant,
    reason = "one event at a time, moved out of the stream at once"
)]
enum Either {
    Job(WatchEvent<KubeJob>),
    Pod(WatchEvent<Pod>),
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
