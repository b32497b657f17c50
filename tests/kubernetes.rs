//! The Kubernetes executor against a mock API server at the HTTP layer
//! (`tower_test`): one scenario per test, each inside a timeout. Watches
//! are bodies of newline-delimited watch events that stay open.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use cairn::exec::{Executor, InfraKind, Job, KubernetesExecutor, Outcome};
use cairn::manifest::{Command, KubernetesSettings, RootVolume};
use futures::StreamExt as _;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody, combinators::BoxBody};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

type Body = BoxBody<Bytes, std::io::Error>;

const NAME: &str = "cairn-oracle-1a2b3c4d-00112233aabbccdd-1";
const JOBS: &str = "/apis/batch/v1/namespaces/default/jobs";
const PODS: &str = "/api/v1/namespaces/default/pods";
const LIMIT: Duration = Duration::from_secs(10);

/// What the mock answers.
enum Reply {
    Json(u16, Value),
    /// A watch: these events, then the stream stays open.
    Watch(Vec<Value>),
    /// A watch whose events come from this stream, then stays open.
    Stream(std::pin::Pin<Box<dyn futures::Stream<Item = Value> + Send + Sync>>),
    Text(&'static str),
}

impl Reply {
    fn into_response(self) -> Response<Body> {
        let (status, body): (u16, Body) = match self {
            Reply::Json(status, value) => (status, full(value.to_string())),
            Reply::Text(text) => (200, full(text.to_owned())),
            Reply::Watch(events) => {
                let lines: Vec<Result<http_body::Frame<Bytes>, std::io::Error>> = events
                    .into_iter()
                    .map(|e| Ok(http_body::Frame::data(Bytes::from(format!("{e}\n")))))
                    .collect();
                let stream = futures::stream::iter(lines).chain(futures::stream::pending());
                (200, BodyExt::boxed(StreamBody::new(stream)))
            }
            Reply::Stream(events) => {
                let stream = events
                    .map(|e| Ok(http_body::Frame::data(Bytes::from(format!("{e}\n")))))
                    .chain(futures::stream::pending());
                (200, BodyExt::boxed(StreamBody::new(stream)))
            }
        };
        Response::builder()
            .status(StatusCode::from_u16(status).unwrap())
            .header("content-type", "application/json")
            .body(body)
            .unwrap()
    }
}

fn full(text: String) -> Body {
    http_body_util::Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed()
}

/// Serves requests with `respond` (given `METHOD URI`); every request, with
/// its body, is sent on the returned channel.
fn cluster(
    mut respond: impl FnMut(&str) -> Reply + Send + 'static,
) -> (kube::Client, UnboundedReceiver<String>) {
    let (service, mut handle) =
        tower_test::mock::pair::<Request<kube::client::Body>, Response<Body>>();
    let (seen, requests) = unbounded_channel();
    tokio::spawn(async move {
        while let Some((request, reply)) = handle.next_request().await {
            let line = format!("{} {}", request.method(), request.uri());
            let body = request.into_body().collect().await.unwrap().to_bytes();
            let response = respond(&line).into_response();
            let _ = seen.send(format!("{line} {}", String::from_utf8_lossy(&body)));
            reply.send_response(response);
        }
    });
    (kube::Client::new(service, "default"), requests)
}

fn settings() -> KubernetesSettings {
    KubernetesSettings {
        namespace: "default".to_owned(),
        image: format!("mirror/oracle@sha256:{}", "ab".repeat(32)),
        root_volume: RootVolume::HostPath,
        unschedulable_timeout: Duration::from_secs(300),
        ttl: Duration::from_secs(600),
        max_jobs: 4,
        node_selector: BTreeMap::new(),
        ..KubernetesSettings::default()
    }
}

fn job(dir: &Path) -> Job {
    Job {
        name: NAME.to_owned(),
        token: "42-1".to_owned(),
        stage: "oracle".to_owned(),
        command: Command::Shell("python3 oracle.py".to_owned()),
        cwd: dir.to_path_buf(),
        env: vec![("CAIRN_ITEM".to_owned(), "task-1".to_owned())],
        timeout: None,
        log: dir.join("job.log"),
        redact: Vec::new(),
        secrets: Vec::new(),
        image: None,
    }
}

fn not_found() -> Reply {
    status(404, "NotFound")
}

fn status(code: u16, reason: &str) -> Reply {
    Reply::Json(
        code,
        json!({ "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                "message": format!("jobs.batch \"{NAME}\" {reason}"), "reason": reason,
                "details": { "name": NAME, "group": "batch", "kind": "jobs" }, "code": code }),
    )
}

fn kube_job(conditions: Value) -> Value {
    json!({ "apiVersion": "batch/v1", "kind": "Job",
            "metadata": { "name": NAME, "namespace": "default", "resourceVersion": "10" },
            "status": { "conditions": conditions } })
}

fn pod(status: Value) -> Value {
    json!({ "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": "pod-1", "namespace": "default", "resourceVersion": "11",
                          "labels": { "job-name": NAME } },
            "status": status })
}

fn pods(items: Vec<Value>) -> Reply {
    Reply::Json(
        200,
        json!({ "apiVersion": "v1", "kind": "PodList", "metadata": { "resourceVersion": "12" }, "items": items }),
    )
}

fn running() -> Value {
    pod(json!({ "phase": "Running" }))
}

fn container(state: Value) -> Value {
    json!([{ "name": "job", "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": state }])
}

fn event(kind: &str, object: Value) -> Value {
    json!({ "type": kind, "object": object })
}

fn is_job_get(line: &str) -> bool {
    line == format!("GET {JOBS}/{NAME}")
}

/// Requests until the channel closes or the scenario ends.
fn drain(requests: &mut UnboundedReceiver<String>) -> Vec<String> {
    let mut seen = Vec::new();
    while let Ok(line) = requests.try_recv() {
        seen.push(line);
    }
    seen
}

fn count(seen: &[String], prefix: &str) -> usize {
    seen.iter().filter(|l| l.starts_with(prefix)).count()
}

async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, future)
        .await
        .expect("the scenario finished within its time limit")
}

#[tokio::test]
async fn a_job_is_created_watched_to_complete_and_its_log_collected() {
    let dir = tempfile::tempdir().unwrap();
    let mut created = false;
    let (client, mut requests) = cluster(move |line| {
        if line.starts_with("POST ") {
            created = true;
            return Reply::Json(201, kube_job(json!([])));
        }
        match line {
            l if is_job_get(l) && !created => not_found(),
            l if is_job_get(l) => Reply::Json(200, kube_job(json!([]))),
            l if l.contains("/jobs?") && l.contains("watch=true") => Reply::Watch(vec![event(
                "MODIFIED",
                kube_job(json!([{ "type": "Complete", "status": "True" }])),
            )]),
            l if l.contains("/pods?") && l.contains("watch=true") => Reply::Watch(vec![]),
            l if l.starts_with(&format!("GET {PODS}?")) => pods(vec![running()]),
            l if l.starts_with(&format!("GET {PODS}/pod-1/log")) => {
                Reply::Text("hello from the pod\n")
            }
            other => panic!("unexpected request {other}"),
        }
    });
    let executor = KubernetesExecutor::with_client(settings(), client);
    let outcome = within(executor.run(&job(dir.path()))).await.unwrap();
    assert_eq!(outcome, Outcome::Success);
    let seen = drain(&mut requests);
    assert_eq!(count(&seen, "POST "), 1, "{seen:#?}");
    let post = seen.iter().find(|l| l.starts_with("POST ")).unwrap();
    assert!(
        post.contains("\"backoffLimit\":0") && post.contains(NAME),
        "{post}"
    );
    assert!(
        count(&seen, "GET /apis/batch/v1/namespaces/default/jobs?") >= 1,
        "watched: {seen:#?}"
    );
    let log = std::fs::read_to_string(dir.path().join("job.log")).unwrap();
    assert_eq!(log, "hello from the pod\n");
}

#[tokio::test]
async fn a_failed_job_reports_its_container_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let mut failed_sent = false;
    let (client, _requests) = cluster(move |line| match line {
        l if l.starts_with("POST ") => Reply::Json(201, kube_job(json!([]))),
        l if is_job_get(l) => Reply::Json(200, kube_job(json!([]))),
        l if l.contains("/jobs?") && l.contains("watch=true") => {
            failed_sent = true;
            Reply::Watch(vec![event(
                "MODIFIED",
                kube_job(
                    json!([{ "type": "Failed", "status": "True", "reason": "BackoffLimitExceeded" }]),
                ),
            )])
        }
        l if l.contains("/pods?") && l.contains("watch=true") => Reply::Watch(vec![]),
        l if l.starts_with(&format!("GET {PODS}?")) && !failed_sent => pods(vec![running()]),
        l if l.starts_with(&format!("GET {PODS}?")) => pods(vec![pod(json!({
            "phase": "Failed",
            "containerStatuses": container(json!({ "terminated": { "exitCode": 3, "reason": "Error" } })),
        }))]),
        l if l.contains("/log") => Reply::Text("no such task\n"),
        other => panic!("unexpected request {other}"),
    });
    let executor = KubernetesExecutor::with_client(settings(), client);
    let running = within(executor.submit(&job(dir.path()))).await.unwrap();
    let outcome = within(running.wait()).await.unwrap();
    assert_eq!(outcome, Outcome::Exit(3));
}

#[tokio::test]
async fn an_image_that_cannot_be_pulled_is_infrastructure_and_its_job_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let pending = || pod(json!({ "phase": "Pending" }));
    let (client, mut requests) = cluster(move |line| match line {
        l if l.starts_with("POST ") => Reply::Json(201, kube_job(json!([]))),
        l if is_job_get(l) => Reply::Json(200, kube_job(json!([]))),
        l if l.starts_with("DELETE ") => Reply::Json(200, kube_job(json!([]))),
        l if l.contains("/jobs?") && l.contains("watch=true") => Reply::Watch(vec![]),
        l if l.contains("/pods?") && l.contains("watch=true") => Reply::Watch(vec![event(
            "MODIFIED",
            pod(json!({
                "phase": "Pending",
                "containerStatuses": container(json!({ "waiting": { "reason": "ErrImagePull" } })),
            })),
        )]),
        l if l.starts_with(&format!("GET {PODS}?")) => pods(vec![pending()]),
        l if l.contains("/log") => status(400, "BadRequest"),
        other => panic!("unexpected request {other}"),
    });
    let executor = KubernetesExecutor::with_client(settings(), client);
    let running = within(executor.submit(&job(dir.path()))).await.unwrap();
    let outcome = within(running.wait()).await.unwrap();
    assert_eq!(outcome, Outcome::Infra(InfraKind::ImagePull));
    let seen = drain(&mut requests);
    assert_eq!(
        count(&seen, &format!("DELETE {JOBS}/{NAME}")),
        1,
        "{seen:#?}"
    );
}

#[tokio::test]
async fn a_pod_unschedulable_past_the_timeout_is_infrastructure() {
    let dir = tempfile::tempdir().unwrap();
    let (client, mut requests) = cluster(move |line| match line {
        l if l.starts_with("POST ") => Reply::Json(201, kube_job(json!([]))),
        l if is_job_get(l) => Reply::Json(200, kube_job(json!([]))),
        l if l.starts_with("DELETE ") => Reply::Json(200, kube_job(json!([]))),
        l if l.contains("watch=true") => Reply::Watch(vec![]),
        l if l.starts_with(&format!("GET {PODS}?")) => pods(vec![pod(json!({
            "phase": "Pending",
            "conditions": [{ "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                             "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu." }],
        }))]),
        l if l.contains("/log") => status(400, "BadRequest"),
        other => panic!("unexpected request {other}"),
    });
    let settings = KubernetesSettings {
        unschedulable_timeout: Duration::from_millis(300),
        ..settings()
    };
    let executor = KubernetesExecutor::with_client(settings, client);
    let running = within(executor.submit(&job(dir.path()))).await.unwrap();
    let started = std::time::Instant::now();
    let outcome = within(running.wait()).await.unwrap();
    assert_eq!(outcome, Outcome::Infra(InfraKind::Unschedulable));
    assert!(started.elapsed() >= Duration::from_millis(300));
    let seen = drain(&mut requests);
    assert_eq!(count(&seen, "DELETE "), 1, "{seen:#?}");
}

#[tokio::test]
async fn an_evicted_pod_is_infrastructure() {
    let dir = tempfile::tempdir().unwrap();
    let (client, _requests) = cluster(move |line| match line {
        l if l.starts_with("POST ") => Reply::Json(201, kube_job(json!([]))),
        l if is_job_get(l) => Reply::Json(200, kube_job(json!([]))),
        l if l.contains("/jobs?") && l.contains("watch=true") => Reply::Watch(vec![event(
            "MODIFIED",
            kube_job(
                json!([{ "type": "Failed", "status": "True", "reason": "BackoffLimitExceeded" }]),
            ),
        )]),
        l if l.contains("watch=true") => Reply::Watch(vec![]),
        l if l.starts_with(&format!("GET {PODS}?")) => pods(vec![pod(json!({
            "phase": "Failed", "reason": "Evicted",
            "message": "The node was low on resource: memory.",
        }))]),
        l if l.contains("/log") => Reply::Text(""),
        other => panic!("unexpected request {other}"),
    });
    let executor = KubernetesExecutor::with_client(settings(), client);
    let outcome = within(executor.run(&job(dir.path()))).await;
    // The initial pod list already shows the eviction, or the Job's failure
    // does: either way it is the node's doing.
    assert_eq!(outcome.unwrap(), Outcome::Infra(InfraKind::NodeLost));
}

#[tokio::test]
async fn a_job_that_exists_after_a_restart_is_adopted_not_created_again() {
    let dir = tempfile::tempdir().unwrap();
    let (client, mut requests) = cluster(move |line| match line {
        l if is_job_get(l) => Reply::Json(
            200,
            kube_job(json!([{ "type": "Complete", "status": "True" }])),
        ),
        l if l.starts_with(&format!("GET {PODS}?")) => {
            pods(vec![pod(json!({ "phase": "Succeeded" }))])
        }
        l if l.contains("/log") => Reply::Text("done earlier\n"),
        other => panic!("unexpected request {other}"),
    });
    let executor = KubernetesExecutor::with_client(settings(), client);
    let outcome = within(executor.run(&job(dir.path()))).await.unwrap();
    assert_eq!(outcome, Outcome::Success);
    let seen = drain(&mut requests);
    assert_eq!(count(&seen, "POST "), 0, "{seen:#?}");
}

#[tokio::test]
async fn a_create_that_finds_the_job_already_there_waits_for_that_one() {
    let dir = tempfile::tempdir().unwrap();
    let (client, mut requests) = cluster(move |line| match line {
        l if l.starts_with("POST ") => status(409, "AlreadyExists"),
        l if is_job_get(l) => Reply::Json(
            200,
            kube_job(json!([{ "type": "Complete", "status": "True" }])),
        ),
        l if l.starts_with(&format!("GET {PODS}?")) => {
            pods(vec![pod(json!({ "phase": "Succeeded" }))])
        }
        l if l.contains("/log") => Reply::Text(""),
        other => panic!("unexpected request {other}"),
    });
    let executor = KubernetesExecutor::with_client(settings(), client);
    let running = within(executor.submit(&job(dir.path()))).await.unwrap();
    assert_eq!(within(running.wait()).await.unwrap(), Outcome::Success);
    let seen = drain(&mut requests);
    assert_eq!(count(&seen, "POST "), 1, "{seen:#?}");
}

#[tokio::test]
async fn an_interrupted_wait_deletes_the_job_in_the_background() {
    interrupted_wait_deletes_the_job().await;
}

/// The scheduler's runtime: the delete is sent before the drop returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_wait_deletes_the_job_on_the_schedulers_runtime() {
    interrupted_wait_deletes_the_job().await;
}

async fn interrupted_wait_deletes_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let (client, mut requests) = cluster(move |line| match line {
        l if l.starts_with("POST ") => Reply::Json(201, kube_job(json!([]))),
        l if is_job_get(l) => Reply::Json(200, kube_job(json!([]))),
        l if l.starts_with("DELETE ") => Reply::Json(200, kube_job(json!([]))),
        l if l.contains("watch=true") => Reply::Watch(vec![]),
        l if l.starts_with(&format!("GET {PODS}?")) => pods(vec![running()]),
        other => panic!("unexpected request {other}"),
    });
    let executor = KubernetesExecutor::with_client(settings(), client);
    let running = within(executor.submit(&job(dir.path()))).await.unwrap();
    let waiting = tokio::spawn(running.wait());
    // Interrupt once the wait is watching the pod.
    within(async {
        while let Some(line) = requests.recv().await {
            if line.contains("/pods?") && line.contains("watch=true") {
                break;
            }
        }
    })
    .await;
    waiting.abort();
    let delete = within(async {
        loop {
            let line = requests.recv().await.expect("the mock is still serving");
            if line.starts_with("DELETE ") {
                return line;
            }
        }
    })
    .await;
    assert!(
        delete.starts_with(&format!("DELETE {JOBS}/{NAME}")),
        "{delete}"
    );
    assert!(
        delete.contains("\"propagationPolicy\":\"Background\""),
        "{delete}"
    );
}

/// 10,000 jobs started at once on an executor with `max_jobs = 64`: the
/// mock cluster, counting Jobs created and not yet complete, never sees
/// more than 64, and does see 64 (the bound is what limits them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_jobs_never_exceed_max_jobs_in_flight() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const JOBS_TOTAL: usize = 10_000;
    const BOUND: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    let active = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let created = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let (service, mut handle) =
        tower_test::mock::pair::<Request<kube::client::Body>, Response<Body>>();
    let counters = (active.clone(), most.clone(), created.clone());
    tokio::spawn(async move {
        let (active, most, created) = counters;
        let named = |name: &str| {
            json!({ "apiVersion": "batch/v1", "kind": "Job",
                    "metadata": { "name": name, "namespace": "default", "resourceVersion": "1" },
                    "status": {} })
        };
        while let Some((request, reply)) = handle.next_request().await {
            let (method, uri) = (request.method().clone(), request.uri().to_string());
            let body = request.into_body().collect().await.unwrap().to_bytes();
            let response = if method == "POST" {
                let object: Value = serde_json::from_slice(&body).unwrap();
                let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let name = object["metadata"]["name"].as_str().unwrap();
                assert!(
                    created.lock().unwrap().insert(name.to_owned()),
                    "{name} created twice"
                );
                Reply::Json(201, named(name))
            } else if uri.contains("/jobs?") && uri.contains("watch=true") {
                // The Job completes a moment after it is watched.
                let name = uri
                    .split("metadata.name%3D")
                    .nth(1)
                    .unwrap()
                    .split('&')
                    .next()
                    .unwrap()
                    .to_owned();
                let active = active.clone();
                Reply::Stream(Box::pin(futures::stream::once(async move {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    active.fetch_sub(1, Ordering::SeqCst);
                    let mut done = named(&name);
                    done["status"] =
                        json!({ "conditions": [{ "type": "Complete", "status": "True" }] });
                    event("MODIFIED", done)
                })))
            } else if uri.contains("/pods?") && uri.contains("watch=true") {
                Reply::Watch(vec![])
            } else if uri.starts_with(&format!("{PODS}?")) {
                pods(vec![])
            } else if method == "GET" && uri.starts_with(&format!("{JOBS}/")) {
                let name = uri.rsplit('/').next().unwrap();
                if created.lock().unwrap().contains(name) {
                    // After its create: still running.
                    Reply::Json(200, named(name))
                } else {
                    not_found()
                }
            } else {
                panic!("unexpected request {method} {uri}")
            };
            reply.send_response(response.into_response());
        }
    });
    let client = kube::Client::new(service, "default");
    let executor = Arc::new(KubernetesExecutor::with_client(
        KubernetesSettings {
            max_jobs: BOUND,
            ..settings()
        },
        client,
    ));
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..JOBS_TOTAL {
        let executor = executor.clone();
        let job = Job {
            name: format!("cairn-scale-{n:05}"),
            ..job(dir.path())
        };
        tasks.spawn(async move { executor.run(&job).await });
    }
    let outcomes = tokio::time::timeout(Duration::from_secs(120), async {
        let mut outcomes = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            outcomes.push(joined.unwrap().unwrap());
        }
        outcomes
    })
    .await
    .expect("10,000 jobs within two minutes");
    assert_eq!(outcomes.len(), JOBS_TOTAL);
    assert!(outcomes.iter().all(|o| *o == Outcome::Success));
    assert_eq!(created.lock().unwrap().len(), JOBS_TOTAL);
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= BOUND,
        "{most} Jobs unfinished at once, the bound is {BOUND}"
    );
    assert_eq!(
        most, BOUND,
        "the bound was never reached: nothing ran side by side"
    );
}

/// The requests of 30 lookups through an executor with `qps = 10`, as the
/// mock API server sees them: when each arrived (on tokio's paused clock,
/// so the figures are the limiter's, not this machine's speed).
async fn arrivals(qps: Option<u32>) -> Vec<Duration> {
    use tower::Layer as _;
    let (service, mut handle) =
        tower_test::mock::pair::<Request<kube::client::Body>, Response<Body>>();
    let start = tokio::time::Instant::now();
    let (seen, mut times) = unbounded_channel();
    tokio::spawn(async move {
        while let Some((_request, reply)) = handle.next_request().await {
            let _ = seen.send(start.elapsed());
            reply.send_response(not_found().into_response());
        }
    });
    let client = match qps {
        Some(qps) => kube::Client::new(cairn::exec::qps_limit(qps).layer(service), "default"),
        None => kube::Client::new(service, "default"),
    };
    let executor = KubernetesExecutor::with_client(settings(), client);
    let dir = tempfile::tempdir().unwrap();
    for n in 0..30 {
        let job = Job {
            name: format!("cairn-qps-{n:02}"),
            ..job(dir.path())
        };
        assert!(executor.attach(&job).await.unwrap().is_none());
    }
    let mut arrived = Vec::new();
    while let Ok(at) = times.try_recv() {
        arrived.push(at);
    }
    arrived
}

#[tokio::test(start_paused = true)]
async fn a_qps_limit_spaces_the_requests_out() {
    let limited = arrivals(Some(10)).await;
    assert_eq!(limited.len(), 30);
    // At most 10 in any one second of the limiter's windows, so 30 span
    // at least two seconds.
    let mut per_second = std::collections::BTreeMap::new();
    for at in &limited {
        *per_second.entry(at.as_secs()).or_insert(0) += 1;
    }
    assert!(per_second.values().all(|n| *n <= 10), "{per_second:?}");
    assert!(
        *limited.last().unwrap() >= Duration::from_secs(2),
        "{limited:?}"
    );
    // Control: without a limit, all 30 go at once.
    let free = arrivals(None).await;
    assert_eq!(free.len(), 30);
    assert!(*free.last().unwrap() < Duration::from_secs(1), "{free:?}");
}
