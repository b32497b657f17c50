//! The services of a run (`[services.NAME]`): a server is brought up when
//! the first stage that uses it is about to run — never for a run whose
//! stages are all fresh or restored — checked, handed to every stage that
//! uses it through one environment variable, and stopped once no stage of
//! the run still needs it, or when the run ends.
//!
//! A service cairn starts (`run`) gets a free port on loopback, its own
//! process group, the run's marker in its environment (so a killed cairn's
//! server is reaped by the next run, as its commands are) and a log at
//! `cache/logs/RUN/services/NAME.log`. A service without `run` is reached
//! where it runs. Either way it is up once `ready` answers 2xx, and usable
//! once `check` exits 0; until then no command of its stages runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::exec::{RUN_MARKER, base_environment};
use crate::manifest::interpolate::walk;
use crate::manifest::{Command, Service};
use gpus::gpus_free;
use process::ServiceProcess;

mod gpus;
mod process;

/// The services one run may bring up.
pub struct Services {
    root: PathBuf,
    log_dir: PathBuf,
    token: String,
    specs: BTreeMap<String, Service>,
    /// Each service's state, behind a lock of its own: one coming up never
    /// holds up another, nor the run.
    states: BTreeMap<String, Mutex<State>>,
}

enum State {
    /// Not brought up in this run (or stopped since).
    Down,
    Up {
        url: String,
        /// (Boxed: a child process is large, and `Down` holds nothing.)
        process: Option<Box<ServiceProcess>>,
        /// The group it serves, for a per-group service.
        group: Option<String>,
    },
    /// It could not come up, or died: the stages that use it fail with
    /// this reason, and it is not started again in this run.
    Failed(String),
}

/// How long a stopped service has to exit before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How often readiness is asked while a service comes up.
const READY_POLL: Duration = Duration::from_millis(100);
/// The longest one readiness request may take.
const READY_REQUEST: Duration = Duration::from_secs(5);
/// Lines of a service's log quoted when it fails to come up.
const LOG_TAIL: usize = 8;

impl Services {
    pub fn new(
        root: &Path,
        log_dir: &Path,
        token: &str,
        specs: &BTreeMap<String, Service>,
    ) -> Self {
        Self {
            root: root.to_owned(),
            log_dir: log_dir.join("services"),
            token: token.to_owned(),
            specs: specs.clone(),
            states: specs
                .keys()
                .map(|name| (name.clone(), Mutex::new(State::Down)))
                .collect(),
        }
    }

    /// The service `name`, brought up (and checked) if it is not yet:
    /// (the variable, the URL) a stage's commands are given; or why it
    /// could not be.
    pub async fn reach(&self, name: &str) -> Result<(String, String), String> {
        self.reach_for(name, None).await
    }

    /// Whether the service `name` serves one group at a time
    /// (`per_group`): its stages reach it group by group, through
    /// [`Services::reach_for`], not once for the stage.
    pub fn is_per_group(&self, name: &str) -> bool {
        self.specs.get(name).is_some_and(|spec| spec.per_group)
    }

    /// [`Services::reach`] for `group` of a per-group service: the server
    /// of another group is stopped first (one at a time, as one GPU
    /// machine serves one model), then this group's is brought up.
    pub async fn reach_for(
        &self,
        name: &str,
        group: Option<&str>,
    ) -> Result<(String, String), String> {
        let (Some(spec), Some(state)) = (self.specs.get(name), self.states.get(name)) else {
            return Err(format!("no service `{name}`"));
        };
        let group = group.filter(|_| spec.per_group);
        if let Some(group) = group
            && !group
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(format!(
                "service `{name}` cannot serve group `{group}`: a per-group service's group is named by letters, digits, `.`, `_` and `-` only"
            ));
        }
        // A service comes up once, whoever asks first; the others wait.
        let mut state = state.lock().await;
        self.notice_exit(spec, &mut state);
        match &mut *state {
            State::Up {
                url, group: serves, ..
            } if serves.as_deref() == group => return Ok((spec.env.clone(), url.clone())),
            State::Up {
                process,
                group: Some(serves),
                ..
            } => {
                if let Some(process) = process.take() {
                    (*process).stop().await;
                    tracing::info!(
                        "service `{name}` for group `{serves}` stopped: the next group's comes up"
                    );
                }
                *state = State::Down;
            }
            State::Up { .. } | State::Down => {}
            State::Failed(why) => return Err(why.clone()),
        }
        let started = Instant::now();
        let whose = group.map_or_else(String::new, |g| format!(" for group `{g}`"));
        match self.bring_up(spec, group).await {
            Ok((url, process)) => {
                tracing::info!(
                    "service `{name}`{whose} is up ({:.1} s)",
                    started.elapsed().as_secs_f64()
                );
                *state = State::Up {
                    url: url.clone(),
                    process: process.map(Box::new),
                    group: group.map(str::to_owned),
                };
                Ok((spec.env.clone(), url))
            }
            Err(why) => {
                self.redact_log(spec).await;
                let why = format!("service `{name}`{whose} {why}");
                *state = State::Failed(why.clone());
                Err(why)
            }
        }
    }

    /// `Err` with why if a service `names` names has died since it came
    /// up: what its stage's commands got from it is not to be trusted.
    pub async fn still_up(&self, names: &[String]) -> Result<(), String> {
        for name in names {
            let (Some(spec), Some(state)) = (self.specs.get(name), self.states.get(name)) else {
                continue;
            };
            let mut state = state.lock().await;
            self.notice_exit(spec, &mut state);
            if let State::Failed(why) = &*state {
                return Err(why.clone());
            }
        }
        Ok(())
    }

    /// A service cairn started that has exited on its own is failed.
    fn notice_exit(&self, spec: &Service, state: &mut State) {
        if let State::Up {
            process: Some(process),
            ..
        } = state
            && let Some(status) = process.exited()
        {
            *state = State::Failed(format!(
                "service `{}` exited ({status}) while its stages ran{}",
                spec.name,
                log_tail(
                    &self.log_dir.join(format!("{}.log", spec.name)),
                    &redactable(spec)
                )
            ));
        }
    }

    /// Stops the service `name` if this run brought it up.
    pub async fn stop(&self, name: &str) {
        let (Some(spec), Some(state)) = (self.specs.get(name), self.states.get(name)) else {
            return;
        };
        let mut state = state.lock().await;
        // One that died first stays failed: a stage still to check it
        // learns why.
        self.notice_exit(spec, &mut state);
        if let State::Up { process, .. } = &mut *state {
            if let Some(process) = process.take() {
                (*process).stop().await;
                tracing::info!("service `{name}` stopped: no stage of this run needs it any more");
            }
            self.redact_log(spec).await;
            *state = State::Down;
        }
    }

    /// The services up now (one coming up this moment is not yet).
    pub fn up(&self) -> Vec<String> {
        self.states
            .iter()
            .filter(|(_, state)| {
                state
                    .try_lock()
                    .is_ok_and(|state| matches!(*state, State::Up { .. }))
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Stops every service this run brought up, and redacts every
    /// service log, whatever became of the service (one that died, one
    /// whose start was cut short).
    pub async fn stop_all(&self) {
        for (name, spec) in &self.specs {
            self.stop(name).await;
            self.redact_log(spec).await;
        }
    }

    async fn bring_up(
        &self,
        spec: &Service,
        group: Option<&str>,
    ) -> Result<(String, Option<ServiceProcess>), String> {
        let deadline = Instant::now() + spec.start_timeout;
        let log = self.log_dir.join(format!("{}.log", spec.name));
        if let Some(need) = &spec.gpus {
            gpus_free(need).await?;
        }
        // `{service.port}` (and `{service.group}`) filled in everything
        // that names it (and the literal braces a first pass kept escaped,
        // unescaped).
        let port = match &spec.run {
            None => None,
            Some(_) => Some(free_port().map_err(|e| format!("found no free port: {e}"))?),
        };
        let filled = Filled { port, group };
        let url = filled.text(&spec.url);
        let mut process = match &spec.run {
            None => None,
            Some(run) => Some(self.spawn(&filled.command(run), spec, &url, &log)?),
        };
        let probe = ready_url(&url, &filled.text(&spec.ready));
        crate::tls::install_provider();
        let client = reqwest::Client::builder()
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
        let mut last;
        loop {
            if let Some(status) = process.as_mut().and_then(ServiceProcess::exited) {
                let hint = if status.success() {
                    " (a service's `run` must keep serving in the foreground, not start a daemon and return)"
                } else {
                    ""
                };
                return Err(format!(
                    "exited ({status}) before it was ready{hint}{}",
                    log_tail(&log, &redactable(spec))
                ));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match client
                .get(&probe)
                .timeout(left.clamp(READY_POLL, READY_REQUEST))
                .send()
                .await
            {
                Ok(answer) if answer.status().is_success() => break,
                Ok(answer) => last = format!("{probe} answered {}", answer.status()),
                Err(error) => last = format!("{probe}: {}", root_cause(&error)),
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "was not ready within {} ({last}){}",
                    humantime::format_duration(spec.start_timeout),
                    if process.is_some() {
                        log_tail(&log, &redactable(spec))
                    } else {
                        String::new()
                    }
                ));
            }
            tokio::time::sleep(READY_POLL).await;
        }
        if let Some(check) = &spec.check {
            self.check(&filled.command(check), spec, &url, &log, deadline)
                .await?;
        }
        Ok((url, process))
    }

    /// Replaces the service's secret values in its log once nothing writes
    /// to it any more.
    async fn redact_log(&self, spec: &Service) {
        let log = self.log_dir.join(format!("{}.log", spec.name));
        let secrets = redactable(spec);
        if !secrets.is_empty()
            && let Err(error) = crate::exec::redact_log(&log, &secrets).await
        {
            tracing::warn!(path = %log.display(), error = %error, "could not redact the service's log");
        }
    }

    /// The environment a service's processes (and its check) get.
    fn environment(&self, spec: &Service, url: &str) -> Vec<(String, String)> {
        let mut env = base_environment();
        env.push((RUN_MARKER.to_owned(), self.token.clone()));
        env.push((spec.env.clone(), url.to_owned()));
        env.extend(secret_values(spec));
        env
    }

    fn command(
        &self,
        command: &Command,
        env: &[(String, String)],
        log: &Path,
    ) -> Result<tokio::process::Command, String> {
        std::fs::create_dir_all(&self.log_dir)
            .map_err(|e| format!("cannot make {}: {e}", self.log_dir.display()))?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("cannot open its log {}: {e}", log.display()))?;
        let err = file
            .try_clone()
            .map_err(|e| format!("cannot open its log {}: {e}", log.display()))?;
        let mut process = match command {
            Command::Shell(script) => {
                let mut c = tokio::process::Command::new("/bin/sh");
                c.arg("-c").arg(script);
                c
            }
            Command::Exec(argv) => {
                let mut c = tokio::process::Command::new(&argv[0]);
                c.args(&argv[1..]);
                c
            }
        };
        process
            .current_dir(&self.root)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .process_group(0);
        Ok(process)
    }

    fn spawn(
        &self,
        run: &Command,
        spec: &Service,
        url: &str,
        log: &Path,
    ) -> Result<ServiceProcess, String> {
        let env = self.environment(spec, url);
        let child = self
            .command(run, &env, log)?
            .spawn()
            .map_err(|e| format!("could not be started: {e}"))?;
        Ok(ServiceProcess::spawned(child))
    }

    /// Runs `check` with the service's URL set; it must exit 0 in time.
    /// Its whole process group is killed if it does not.
    async fn check(
        &self,
        check: &Command,
        spec: &Service,
        url: &str,
        log: &Path,
        deadline: Instant,
    ) -> Result<(), String> {
        let env = self.environment(spec, url);
        let child = self
            .command(check, &env, log)?
            .spawn()
            .map_err(|e| format!("check could not be started: {e}"))?;
        let mut check = ServiceProcess::spawned(child);
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, check.child.wait()).await {
            Ok(Ok(status)) if status.success() => Ok(()),
            Ok(Ok(status)) => Err(format!(
                "failed its check ({status}){}",
                log_tail(log, &redactable(spec))
            )),
            Ok(Err(error)) => Err(format!("check could not be waited for: {error}")),
            Err(_) => Err(format!(
                "check did not finish in the {:.1} s left of its start_timeout{}",
                left.as_secs_f64(),
                log_tail(log, &redactable(spec))
            )),
        }
    }
}

/// (name, value) of each of the service's secrets set in cairn's
/// environment.
fn secret_values(spec: &Service) -> Vec<(String, String)> {
    spec.secrets
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|value| (name.clone(), value)))
        .collect()
}

/// Secret values long enough to redact (shorter ones would redact
/// ordinary text).
fn redactable(spec: &Service) -> Vec<(String, String)> {
    secret_values(spec)
        .into_iter()
        .filter(|(_, value)| value.len() >= 4)
        .collect()
}

/// A port on loopback no one listens on now.
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// What a service's templates are filled with: its port, if cairn starts
/// it, and the group it serves, if it serves one at a time. (A group is a
/// plain word, checked before: it needs no quoting.)
struct Filled<'f> {
    port: Option<u16>,
    group: Option<&'f str>,
}

impl Filled<'_> {
    /// `text` (a template: literal braces escaped) with `{service.port}`
    /// and `{service.group}` filled in, where there is one, and every
    /// other brace made literal.
    fn text(&self, text: &str) -> String {
        let filled: Result<String, Vec<()>> = walk(text, false, |p| {
            Ok(match &text[p.range.clone()] {
                crate::manifest::SERVICE_PORT => self.port.map(|port| port.to_string()),
                crate::manifest::SERVICE_GROUP => self.group.map(str::to_owned),
                _ => None,
            })
        });
        filled.unwrap_or_else(|_| text.to_owned())
    }

    fn command(&self, command: &Command) -> Command {
        match command {
            Command::Shell(script) => Command::Shell(self.text(script)),
            Command::Exec(argv) => Command::Exec(argv.iter().map(|a| self.text(a)).collect()),
        }
    }
}

/// Where readiness is asked: `ready` under `url` (or a URL of its own).
fn ready_url(url: &str, ready: &str) -> String {
    if ready.starts_with("http://") || ready.starts_with("https://") {
        ready.to_owned()
    } else if ready.is_empty() {
        url.to_owned()
    } else {
        format!(
            "{}/{}",
            url.trim_end_matches('/'),
            ready.trim_start_matches('/')
        )
    }
}

/// The innermost cause of `error` (`Connection refused (os error 111)`),
/// which says what the layers above it only wrap.
fn root_cause(error: &dyn std::error::Error) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// The last lines of a log, as `; its log ends: …`, or nothing.
fn log_tail(log: &Path, secrets: &[(String, String)]) -> String {
    let Ok(text) = std::fs::read_to_string(log) else {
        return String::new();
    };
    let text = crate::exec::redact_text(&text, secrets).unwrap_or(text);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail = &lines[lines.len().saturating_sub(LOG_TAIL)..];
    format!("; {} ends:\n  {}", log.display(), tail.join("\n  "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_and_group_are_filled_in_urls_and_commands_and_nothing_else_is() {
        let fill = |text: &str, port, group| Filled { port, group }.text(text);
        assert_eq!(
            fill("http://127.0.0.1:{service.port}/v1", Some(8123), None),
            "http://127.0.0.1:8123/v1"
        );
        assert_eq!(
            fill(
                "serve --port {service.port} '{{x.y}}' {other.z}",
                Some(9),
                None
            ),
            "serve --port 9 '{x.y}' {other.z}"
        );
        assert_eq!(fill("check '{{x}}'", None, None), "check '{x}'");
        assert_eq!(
            fill(
                "serve --model {service.group} {service.port}",
                Some(7),
                Some("model-a")
            ),
            "serve --model model-a 7"
        );
        // Not a per-group service: the placeholder stays as it is.
        assert_eq!(fill("{service.group}", None, None), "{service.group}");
    }

    #[test]
    fn readiness_is_asked_under_the_url_unless_it_is_a_url_itself() {
        assert_eq!(
            ready_url("http://h:1/v1", "/models"),
            "http://h:1/v1/models"
        );
        assert_eq!(
            ready_url("http://h:1/v1/", "models"),
            "http://h:1/v1/models"
        );
        assert_eq!(ready_url("http://h:1/v1", ""), "http://h:1/v1");
        assert_eq!(
            ready_url("http://h:1/v1", "http://h:1/health"),
            "http://h:1/health"
        );
    }
}
