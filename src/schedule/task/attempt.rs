//! One item's attempts: its job started (or adopted) and put on record,
//! waited for, its checks and result read, classified, retried.

use super::*;
use crate::trajectory::Trajectory;

/// Runs one item: its command and checks, classification and retries.
pub(super) struct ItemRunner {
    pub(super) executor: Arc<dyn Executor>,
    /// `cairn-STAGE-WORKSPACE`, see [`job_prefix`].
    pub(super) job_prefix: String,
    pub(super) job: Job,
    pub(super) checks: Vec<Command>,
    pub(super) spec: Foreach,
    pub(super) classify: Vec<ClassifyRule>,
    pub(super) retry: Retry,
    pub(super) limits: Limits,
    pub(super) holds: Vec<usize>,
    pub(super) priority: u64,
    pub(super) log_dir: PathBuf,
    pub(super) stage: String,
    pub(super) run_id: i64,
    pub(super) attempts: UnboundedSender<ItemAttempt>,
    pub(super) outputs: ItemOutputs,
    /// What storing the items' entries hashed, for the stat cache.
    pub(super) seen: std::sync::Mutex<Vec<(PathBuf, StatEntry)>>,
    pub(super) store: ObjectStore,
    /// Where final outcomes are uploaded to the remote cache, if anywhere.
    pub(super) uploads: Option<Uploads>,
    pub(super) producer: Producer,
    /// What its items read, looked at again as each attempt ends.
    pub(super) inputs_read: Option<Arc<InputsRead>>,
    /// The per-group services of the group running now (variable, URL):
    /// set as each group starts, groups running one at a time.
    pub(super) group_env: std::sync::Mutex<Vec<(String, String)>>,
}

impl ItemRunner {
    /// The item's final outcome in this run and its attempt count; `None`
    /// if the run stopped first.
    pub(super) async fn run(
        &self,
        planned: &PlannedItem,
    ) -> Result<Option<ItemEnd>, ScheduleError> {
        let item = &planned.item;
        let filled = fill_command(&self.job.command, item).and_then(|command| {
            Ok((
                command,
                self.checks
                    .iter()
                    .map(|c| fill_command(c, item))
                    .collect::<Result<Vec<_>, _>>()?,
            ))
        });
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let Some(permits) = self
                .limits
                .acquire_for(self.executor.as_ref(), self.priority, &self.holds)
                .await
            else {
                return Ok(None);
            };
            let started_ms = now_ms();
            let log = self
                .log_dir
                .join(format!("{}.{attempt}.log", file_name(&item.key)));
            let mut handle = None;
            let (class, rule, exit_code, result) = match &filled {
                Err(message) => {
                    self.outputs.clear(item)?;
                    (ItemClass::Error, Some(message.clone()), None, None)
                }
                Ok((command, checks)) => {
                    let previous = planned.attempts_before;
                    let mut job = Job {
                        // The same item, fingerprint and attempt number give
                        // the same name: a job an earlier cairn process
                        // submitted for this attempt is adopted, not
                        // submitted again.
                        name: format!(
                            "{}-{}-{}",
                            self.job_prefix,
                            &planned.fingerprint.hex()[..16],
                            previous + attempt
                        ),
                        command: command.clone(),
                        log: log.clone(),
                        image: planned
                            .image
                            .as_deref()
                            .map(str::to_owned)
                            .or_else(|| self.job.image.clone()),
                        ..self.job.clone()
                    };
                    if let Ok(group_env) = self.group_env.lock() {
                        for (variable, url) in group_env.iter() {
                            job.env.retain(|(k, _)| k != variable);
                            job.env.push((variable.clone(), url.clone()));
                        }
                    }
                    job.env
                        .push((ITEM_MARKER.to_owned(), item.item_key().to_owned()));
                    if let Some(sample) = &item.sample {
                        job.env
                            .push((SAMPLE_MARKER.to_owned(), sample.index.to_string()));
                        job.env
                            .push((SEED_MARKER.to_owned(), sample.seed.to_string()));
                    }
                    job.env
                        .push((ATTEMPT_MARKER.to_owned(), (previous + attempt).to_string()));
                    let started_job =
                        start_job(self.executor.as_ref(), &job, || self.outputs.clear(item))
                            .await?;
                    // On record before it ends: a cairn that dies now
                    // leaves the job's handle behind.
                    let (started_handle, outcome) = started_job
                        .outcome(|handle| {
                            let _ = self.attempts.send(ItemAttempt {
                                class: RUNNING.to_owned(),
                                handle: Some(handle.to_owned()),
                                ..self.attempt_record(planned, attempt, started_ms)
                            });
                        })
                        .await?;
                    handle = started_handle;
                    let mut failed_check = None;
                    if outcome == Outcome::Success {
                        for (n, check) in checks.iter().enumerate() {
                            let check_job = Job {
                                name: format!("{}-check{}", job.name, n + 1),
                                command: check.clone(),
                                ..job.clone()
                            };
                            let check_outcome = self.executor.run(&check_job).await?;
                            if check_outcome != Outcome::Success {
                                failed_check = Some(format!(
                                    "check `{}` {}",
                                    check.display(),
                                    check_outcome.describe()
                                ));
                                break;
                            }
                        }
                    }
                    let (result, result_problem) = self.read_result(item);
                    let trajectory = self.read_trajectory(item);
                    let result = with_trajectory(result, trajectory.as_ref());
                    let judged = match failed_check {
                        // A command that claims success but fails its
                        // check is an error, never an ok.
                        Some(check) => (ItemClass::Error, Some(check)),
                        None => match classify(&self.classify, outcome, &log, 0, result.as_ref()) {
                            (ItemClass::Ok, rule) => {
                                // An unreadable trajectory says more than
                                // a check on what it would have said.
                                let unread = match &trajectory {
                                    Some(Err(problem)) => Some(problem.clone()),
                                    _ => None,
                                };
                                match (
                                    result_problem.or(unread),
                                    self.failed_result_check(result.as_ref()),
                                ) {
                                    (Some(problem), _) => (ItemClass::Error, Some(problem)),
                                    (None, Some(check)) => (ItemClass::Error, Some(check)),
                                    (None, None) => (ItemClass::Ok, rule),
                                }
                            }
                            other => other,
                        },
                    };
                    let (class, rule) = judged_by_trajectory(judged, trajectory.as_ref());
                    (class, rule, outcome.exit_code(), result)
                }
            };
            drop(permits);
            // An item that read an input changed while it ran is not
            // judged by what it made of it (see `inputs_read`).
            let changed = self
                .spec
                .keeps(&class)
                .then(|| self.inputs_read.as_ref()?.changed_for_item(&planned.inputs))
                .flatten();
            let (class, rule) = match changed {
                Some(message) => (ItemClass::Error, Some(message)),
                None => (class, rule),
            };
            let (class, rule, outputs) = if self.outputs.is_empty() {
                (class, rule, None)
            } else if self.spec.keeps(&class) {
                match self.outputs.store(item, &class, &self.store).await? {
                    Ok(published) => {
                        if let Ok(mut seen) = self.seen.lock() {
                            seen.extend(published.seen);
                        }
                        (class, rule, Some(published.records))
                    }
                    Err(message) => {
                        self.outputs.clear(item)?;
                        (ItemClass::Error, Some(message), None)
                    }
                }
            } else {
                // A failed attempt leaves nothing behind.
                self.outputs.clear(item)?;
                (class, rule, None)
            };
            let why_failed = rule
                .clone()
                .or_else(|| exit_code.map(|code| format!("exit status {code}")));
            let result_text = result.as_ref().map(|r| r.to_string());
            // A final outcome is shared (once the attempt is not retried):
            // its entry is made before the record takes the values.
            let upload = self
                .uploads
                .as_ref()
                .filter(|_| class.is_final())
                .map(|uploads| {
                    let producer = Producer {
                        started_ms,
                        finished_ms: now_ms(),
                        exit_code,
                        ..self.producer.clone()
                    };
                    let entry = super::super::shared_cache::item_entry(
                        &self.stage,
                        planned,
                        &class,
                        rule.clone(),
                        result_text.clone(),
                        outputs.as_deref().unwrap_or_default(),
                        producer,
                    );
                    (uploads, entry)
                });
            let _ = self.attempts.send(ItemAttempt {
                finished_ms: now_ms(),
                exit_code,
                class: class.name().to_owned(),
                rule,
                log_path: log.exists().then(|| log.to_string_lossy().into_owned()),
                result: result_text,
                outputs,
                handle,
                ..self.attempt_record(planned, attempt, started_ms)
            });
            if self.retry.on.contains(&class) && attempt <= self.retry.max {
                tokio::select! {
                    () = tokio::time::sleep(self.retry.backoff_before(attempt)) => continue,
                    // The next attempt would find the run stopped anyway.
                    () = self.limits.stopped() => {}
                }
            }
            if let Some((uploads, entry)) = upload {
                uploads.send(entry, Vec::new());
            }
            let attempts = planned.outcome.as_ref().map_or(0, |(_, n)| *n) + attempt;
            return Ok(Some(ItemEnd {
                class,
                attempts,
                result,
                why: why_failed,
                log: log.exists().then_some(log),
            }));
        }
    }
}

/// An item at the end of a run.
pub(super) struct ItemEnd {
    pub(super) class: ItemClass,
    pub(super) attempts: u32,
    pub(super) result: Option<serde_json::Value>,
    /// Why its last attempt failed (the rule, check or exit status).
    pub(super) why: Option<String>,
    /// Its last attempt's log, if the attempt printed anything.
    pub(super) log: Option<PathBuf>,
}

impl ItemRunner {
    /// The record of an attempt that started at `started_ms`, before
    /// anything is known of how it ends.
    fn attempt_record(&self, planned: &PlannedItem, attempt: u32, started_ms: i64) -> ItemAttempt {
        ItemAttempt {
            code: Some(*planned.code),
            ..ItemAttempt::started(
                self.run_id,
                &self.stage,
                &planned.item.key,
                planned.fingerprint,
                attempt,
                started_ms,
            )
        }
    }

    /// The item's JSON result, if the stage declares one: `(result,
    /// problem)`, where the problem says why it is missing or unreadable.
    fn read_result(&self, item: &Item) -> (Option<serde_json::Value>, Option<String>) {
        let Some(template) = &self.spec.result else {
            return (None, None);
        };
        let (path, bytes) = match read_item_file(&self.job.cwd, template, item, "item result") {
            Ok(read) => read,
            Err(problem) => return (None, Some(problem)),
        };
        match serde_json::from_slice(&bytes) {
            // A secret the command wrote into its result is redacted as in
            // its log: the result reaches the ledger and the merged output.
            Ok(mut value) => {
                redact_json(&mut value, &self.job.redact);
                (Some(value), None)
            }
            Err(error) => (
                None,
                Some(format!("item result `{path}` is not JSON: {error}")),
            ),
        }
    }

    /// What the item's trajectory says, if the stage declares one; the
    /// error says why it cannot be read.
    fn read_trajectory(&self, item: &Item) -> Option<Result<Trajectory, String>> {
        let template = self.spec.trajectory.as_ref()?;
        Some(
            read_item_file(&self.job.cwd, template, item, "item trajectory").and_then(
                |(path, bytes)| {
                    Trajectory::parse(&bytes)
                        .map_err(|why| format!("item trajectory `{path}` {why}"))
                },
            ),
        )
    }

    /// The first result check that fails, described.
    fn failed_result_check(&self, result: Option<&serde_json::Value>) -> Option<String> {
        self.spec
            .result_checks
            .iter()
            .find(|check| !result.is_some_and(|r| check.holds(r)))
            .map(|check| format!("result check `{}` failed", check.text))
    }
}

/// The path `template` names for `item` (under `cwd`) and its bytes; the
/// error names `what` and says why it cannot be read.
fn read_item_file(
    cwd: &Path,
    template: &str,
    item: &Item,
    what: &str,
) -> Result<(String, Vec<u8>), String> {
    let path = fill(template, item)?;
    if leaves_root(&path) {
        return Err(format!("{what} `{path}` lies outside the project root"));
    }
    match crate::fingerprint::read_regular(&cwd.join(&path)) {
        Ok(bytes) => Ok((path, bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("{what} `{path}` was not written"))
        }
        Err(e) => Err(format!("{what} `{path}` cannot be read: {e}")),
    }
}

/// `result` with what cairn read of the trajectory put under
/// `trajectory` (a result that is not an object is kept as it is).
fn with_trajectory(
    result: Option<serde_json::Value>,
    trajectory: Option<&Result<Trajectory, String>>,
) -> Option<serde_json::Value> {
    let Some(Ok(trajectory)) = trajectory else {
        return result;
    };
    let mut result = result.unwrap_or_else(|| serde_json::json!({}));
    if let Some(map) = result.as_object_mut() {
        map.insert("trajectory".to_owned(), trajectory.to_json());
    }
    Some(result)
}

/// `(class, rule)` judged again by the trajectory: a pass or a verdict
/// whose trajectory cannot be read, or is empty, is an error.
fn judged_by_trajectory(
    (class, rule): (ItemClass, Option<String>),
    trajectory: Option<&Result<Trajectory, String>>,
) -> (ItemClass, Option<String>) {
    match trajectory {
        Some(read) if class.is_final() => match read {
            Err(problem) => (ItemClass::Error, Some(problem.clone())),
            Ok(trajectory) => match trajectory.empty() {
                Some(why) => (
                    ItemClass::Error,
                    Some(format!(
                        "its trajectory {why}: an empty trajectory is never a pass, nor a verdict"
                    )),
                ),
                None => (class, rule),
            },
        },
        _ => (class, rule),
    }
}

/// Whether a relative path written by filling a template (`..` from an
/// item field, or an absolute path) leads outside the project root.
fn leaves_root(path: &str) -> bool {
    let mut depth = 0usize;
    for component in Path::new(path).components() {
        match component {
            std::path::Component::Normal(_) => depth += 1,
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir if depth > 0 => depth -= 1,
            _ => return true,
        }
    }
    false
}

/// Redacts every secret value in the strings (keys included) of `value`.
fn redact_json(value: &mut serde_json::Value, secrets: &[(String, String)]) {
    if secrets.is_empty() {
        return;
    }
    match value {
        serde_json::Value::String(text) => {
            if let Some(redacted) = redact_text(text, secrets) {
                *text = redacted;
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                redact_json(item, secrets);
            }
        }
        serde_json::Value::Object(map) => {
            let entries = std::mem::take(map);
            for (key, mut item) in entries {
                redact_json(&mut item, secrets);
                map.insert(redact_text(&key, secrets).unwrap_or(key), item);
            }
        }
        _ => {}
    }
}
