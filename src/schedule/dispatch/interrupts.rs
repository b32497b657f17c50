//! Ctrl-C, SIGTERM and SIGHUP: each interrupts a run.

use super::*;

/// The signals that end a run in order: SIGINT (Ctrl-C), SIGTERM and SIGHUP.
pub(super) struct Interrupts {
    signals: [tokio::signal::unix::Signal; 3],
}

impl Interrupts {
    pub(super) fn listen() -> Result<Self, ScheduleError> {
        use tokio::signal::unix::{SignalKind, signal};
        let listen = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| ScheduleError::Task(format!("cannot listen for {name}: {e}")))
        };
        Ok(Self {
            signals: [
                listen(SignalKind::interrupt(), "SIGINT")?,
                listen(SignalKind::terminate(), "SIGTERM")?,
                listen(SignalKind::hangup(), "SIGHUP")?,
            ],
        })
    }

    /// Resolves when any of the signals arrives.
    pub(super) async fn recv(&mut self) {
        let [int, term, hup] = &mut self.signals;
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
    }
}
