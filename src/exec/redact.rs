//! Secrets kept out of logs: every secret value replaced by
//! `[redacted NAME]`.

/// `text` with every secret value replaced by `[redacted NAME]`, or `None`
/// if it holds none.
pub fn redact_text(text: &str, secrets: &[(String, String)]) -> Option<String> {
    let mut redacted: Option<String> = None;
    for (name, value) in secrets {
        let current = redacted.as_deref().unwrap_or(text);
        if current.contains(value.as_str()) {
            redacted = Some(current.replace(value.as_str(), &format!("[redacted {name}]")));
        }
    }
    redacted
}

/// Replaces every secret value in the log with `[redacted NAME]` (temp file
/// and rename, so no reader sees a half-redacted log).
pub async fn redact_log(
    log: &std::path::Path,
    secrets: &[(String, String)],
) -> std::io::Result<()> {
    if secrets.is_empty() {
        return Ok(());
    }
    // Reading and rewriting a long log is blocking work: on the blocking
    // pool, so hundreds of jobs ending at once keep the event loop free.
    let (log, secrets) = (log.to_owned(), secrets.to_vec());
    tokio::task::spawn_blocking(move || redact_log_now(&log, &secrets))
        .await
        .map_err(std::io::Error::other)?
}

fn redact_log_now(log: &std::path::Path, secrets: &[(String, String)]) -> std::io::Result<()> {
    let bytes = match std::fs::read(log) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let text = String::from_utf8_lossy(&bytes);
    if let Some(text) = redact_text(&text, secrets) {
        let temp = log.with_extension("log.redacting");
        std::fs::write(&temp, text)?;
        std::fs::rename(&temp, log)?;
    }
    Ok(())
}
