//! What a command-line tool is expected to do: find its project from a
//! subdirectory, honour `NO_COLOR` on a terminal, and describe every
//! `--json` in its help.

mod common;

use std::process::Command;

use common::{Project, bin};

const MANIFEST: &str = r#"
[pipeline]
name = "conventions"

[stages.make]
run = "echo made > {out.made}"
outputs = { made = "state/made.txt" }
"#;

#[test]
fn the_manifest_is_found_in_a_parent_directory() {
    let p = Project::new();
    p.file("cairn.toml", MANIFEST);
    p.file("deep/er/.keep", "");
    let run = Command::new(bin())
        .arg("run")
        .current_dir(p.path("deep/er"))
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    // The project root is the manifest's directory, not where cairn ran.
    assert_eq!(p.read("state/made.txt"), "made\n");
    assert!(!p.exists("deep/er/state"));
    let status = Command::new(bin())
        .args(["status", "--json"])
        .current_dir(p.path("deep"))
        .output()
        .unwrap();
    assert!(status.status.success());
    assert!(String::from_utf8_lossy(&status.stdout).contains("\"fresh\""));
}

#[test]
fn without_a_manifest_anywhere_up_the_tree_the_error_says_where_it_looked() {
    let p = Project::new();
    p.file("sub/.keep", "");
    let run = Command::new(bin())
        .arg("status")
        .current_dir(p.path("sub"))
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("no `cairn.toml` in") && stderr.contains("or any parent directory"),
        "{stderr}"
    );
}

/// `cairn ARGS` run on a pseudo-terminal (util-linux `script`), so that
/// stderr is a terminal; returns what the terminal showed.
fn on_a_terminal(p: &Project, args: &str, no_color: Option<&str>) -> String {
    common::require_tool("script");
    let mut command = Command::new("script");
    command
        .args(["-qec", &format!("{} {args}", bin()), "/dev/null"])
        .current_dir(p.root())
        .env("TERM", "xterm")
        .env_remove("NO_COLOR");
    if let Some(value) = no_color {
        command.env("NO_COLOR", value);
    }
    let out = command.output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn no_color_turns_colours_off_on_a_terminal() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        "[pipeline]\nname = 'x'\n[stages.a]\nrun = 'true'\nbogus = 1\n",
    );
    // Control: on a terminal, the manifest error and run lines are coloured.
    let coloured = on_a_terminal(&p, "status", None);
    assert!(
        coloured.contains("\x1b["),
        "no colour on a terminal: {coloured:?}"
    );
    let plain = on_a_terminal(&p, "status", Some("1"));
    assert!(plain.contains("bogus"), "{plain:?}");
    assert!(
        !plain.contains("\x1b["),
        "colour despite NO_COLOR: {plain:?}"
    );

    p.file("cairn.toml", MANIFEST);
    let plain = on_a_terminal(&p, "run -v", Some("1"));
    assert!(plain.contains("make"), "{plain:?}");
    assert!(
        !plain.contains("\x1b[3") && !plain.contains("\x1b[2m"),
        "colour despite NO_COLOR: {plain:?}"
    );
}

#[test]
fn every_json_flag_says_what_it_prints() {
    for command in [
        "status",
        "why",
        "log",
        "show",
        "audit",
        "provenance",
        "verify",
        "register",
    ] {
        let help = Command::new(bin())
            .args([command, "--help"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&help.stdout);
        let line = text
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("--json"))
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            line.contains("JSON"),
            "`cairn {command} --help` does not say what --json prints:\n{text}"
        );
    }
}
