//! Small formatting helpers shared by the commands.

use std::io::Write;
use std::time::{Duration, UNIX_EPOCH};

/// Whether stderr gets colours: it is a terminal and `NO_COLOR` is not set
/// to a non-empty value (<https://no-color.org>).
pub fn stderr_color() -> bool {
    use std::io::IsTerminal as _;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// RFC 3339 UTC time of a millisecond timestamp.
pub fn time(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// A short duration: `0.42s`, `12.3s`, `4m05s`.
pub fn elapsed(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 10.0 {
        format!("{s:.2}s")
    } else if s < 60.0 {
        format!("{s:.1}s")
    } else {
        format!("{}m{:02}s", d.as_secs() / 60, d.as_secs() % 60)
    }
}

pub fn elapsed_ms(from: i64, to: i64) -> String {
    elapsed(Duration::from_millis((to - from).max(0) as u64))
}

/// Writes `value` as pretty JSON and a newline to stdout.
pub fn json(value: &impl serde::Serialize) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    // An I/O error keeps its kind (a reader that left is a broken pipe,
    // which ends a command quietly), a serialisation error is one.
    serde_json::to_writer_pretty(&mut out, value).map_err(|e| match e.io_error_kind() {
        Some(kind) => std::io::Error::from(kind),
        None => std::io::Error::other(e),
    })?;
    writeln!(out)
}

/// Left-aligned columns.
pub fn table(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows.iter().map(Vec::len).max().unwrap_or(0))
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The last `lines` lines of a log file.
pub fn log_tail(path: &std::path::Path, lines: usize) -> Option<String> {
    let text = std::fs::read(path).ok()?;
    let text = String::from_utf8_lossy(&text);
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    Some(all[start..].join("\n"))
}
