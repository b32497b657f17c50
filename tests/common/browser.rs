//! Headless Chromium (Debian's `chromium`) on a local page: the DOM after
//! its scripts ran, what its console said, a screenshot.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// What the browser made of a page.
pub struct Opened {
    /// The DOM, serialised after the page's scripts ran.
    pub dom: String,
    /// The console's lines (messages and uncaught errors).
    pub console: Vec<String>,
}

/// Chromium run headless on `page` with `args`; its stdout to `out`, its
/// stderr returned. Its profile lives in `scratch`, apart from any other
/// test's browser.
fn chromium(scratch: &Path, page: &Path, args: &[&str], out: &Path) -> String {
    super::require_tool("chromium");
    std::fs::create_dir_all(scratch).unwrap();
    let err = scratch.join("stderr.txt");
    let child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!(
            "--user-data-dir={}",
            scratch.join("profile").display()
        ))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("chromium starts");
    let done = super::output_within(child, Duration::from_secs(120), "chromium");
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    assert!(done.status.success(), "chromium failed: {stderr}");
    stderr
}

/// Opens `page`: its DOM and console.
pub fn open(scratch: &Path, page: &Path) -> Opened {
    let out = scratch.join("dom.html");
    let stderr = chromium(scratch, page, &["--dump-dom"], &out);
    Opened {
        dom: std::fs::read_to_string(&out).unwrap(),
        console: stderr
            .lines()
            .filter(|l| l.contains(":CONSOLE"))
            .map(str::to_owned)
            .collect(),
    }
}

/// A PNG screenshot of `page` at `width`×`height`, written to `png`.
pub fn screenshot(scratch: &Path, page: &Path, width: u32, height: u32, png: &Path) {
    let out = scratch.join("screenshot.out");
    chromium(
        scratch,
        page,
        &[
            &format!("--screenshot={}", png.display()),
            &format!("--window-size={width},{height}"),
            "--hide-scrollbars",
        ],
        &out,
    );
    assert!(png.is_file(), "chromium wrote no screenshot");
}
