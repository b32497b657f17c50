//! A plain stage's command as one implicit item: every attempt on record,
//! classified by the stage's `classify` rules and retried by its `retry`.

mod common;

use common::Project;

fn attempts(p: &Project, stage: &str) -> Vec<serde_json::Value> {
    let show = p.cairn(&["show", stage, "--json"]);
    show.success();
    let json: serde_json::Value = serde_json::from_str(&show.stdout()).unwrap();
    json["attempts"].as_array().cloned().unwrap_or_default()
}

fn field<'a>(attempts: &'a [serde_json::Value], name: &str) -> Vec<&'a serde_json::Value> {
    attempts.iter().map(|a| &a[name]).collect()
}

/// A plain stage whose command fails its first `fail` attempts (of every
/// run) with exit 75, and prints `say` when it fails.
fn flaky(fail: u32, say: &str, rules: &str, retry: &str) -> Project {
    let p = Project::new();
    p.file(
        "cairn.toml",
        &format!(
            r#"
[pipeline]
name = "flaky"

[stages.fetch]
run = "echo $CAIRN_ATTEMPT >> attempts.log; if [ $CAIRN_ATTEMPT -le {fail} ]; then echo '{say}'; exit 75; fi; echo data > data.txt"
outputs = ["data.txt"]
classify = [{rules}]
retry = {retry}

[stages.use]
run = "cat data.txt > used.txt"
inputs = ["data.txt"]
outputs = ["used.txt"]
"#
        ),
    );
    p
}

#[test]
fn an_infra_failure_of_a_plain_stage_is_retried_and_every_attempt_recorded() {
    let p = flaky(
        1,
        "PodReadyTimeout",
        r#"{ exit = 75, as = "infra" }"#,
        "{ max = 2 }",
    );
    let run = p.cairn(&["run"]);
    run.success();
    assert!(run.stderr().contains("2 ran"), "{}", run.stderr());
    assert!(
        run.stderr().contains("retry  fetch: infra (attempt 1)"),
        "the retry is told: {}",
        run.stderr()
    );
    assert_eq!(p.lines("attempts.log"), ["1", "2"]);
    assert_eq!(p.read("used.txt"), "data\n");
    let fetch = attempts(&p, "fetch");
    assert_eq!(field(&fetch, "class"), ["infra", "ok"]);
    assert_eq!(field(&fetch, "exit_code"), [75, 0]);
    assert!(
        fetch
            .iter()
            .all(|a| a["handle"].as_str().is_some_and(|h| h.starts_with("pid:")))
    );

    // Fresh now: nothing runs, nothing is attempted.
    let again = p.cairn(&["run"]);
    again.success();
    assert!(again.stderr().contains("0 ran"), "{}", again.stderr());
    assert_eq!(p.lines("attempts.log").len(), 2);
}

#[test]
fn a_plain_stage_without_rules_is_not_retried_and_its_next_run_is_the_next_attempt() {
    // Exit 75 without a rule is an error: `retry` (on infra) does not apply.
    let p = flaky(1, "PodReadyTimeout", "", "{ max = 2 }");
    let run = p.cairn(&["run"]);
    run.code_is(1);
    assert!(
        run.stderr().contains("command exited with status 75"),
        "{}",
        run.stderr()
    );
    assert_eq!(p.lines("attempts.log"), ["1"]);
    assert!(
        !p.exists("used.txt"),
        "nothing downstream of a failure runs"
    );
    // The next run's attempt is numbered after it, and succeeds.
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("attempts.log"), ["1", "2"]);
    assert_eq!(field(&attempts(&p, "fetch"), "class"), ["error", "ok"]);
}

#[test]
fn output_rules_read_only_what_the_attempt_itself_printed() {
    // Attempt 1 prints the infra marker; attempt 2 fails without it. Both
    // share the stage's log, yet attempt 2 is an error, and not retried
    // again although `max` would allow it.
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "marker"

[stages.fetch]
run = "echo $CAIRN_ATTEMPT >> attempts.log; if [ $CAIRN_ATTEMPT = 1 ]; then echo PodReadyTimeout; fi; exit 1"
outputs = ["data.txt"]
classify = [{ exit = 1, output = "PodReadyTimeout", as = "infra" }]
retry = { max = 3 }
"#,
    );
    let run = p.cairn(&["run"]);
    run.code_is(1);
    assert_eq!(p.lines("attempts.log"), ["1", "2"]);
    assert_eq!(field(&attempts(&p, "fetch"), "class"), ["infra", "error"]);
    assert!(
        run.stderr().contains("(attempt 2, `error`)"),
        "{}",
        run.stderr()
    );
}

#[test]
fn a_rule_can_accept_an_exit_status_and_the_outputs_are_still_checked() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "accept"

[stages.lint]
run = "echo warnings > report.txt; exit 3"
outputs = ["report.txt"]
classify = [{ exit = 3, as = "ok" }]

[stages.broken]
run = "exit 3"
outputs = ["missing.txt"]
classify = [{ exit = 3, as = "ok" }]
"#,
    );
    let run = p.cairn(&["run", "--keep-going"]);
    run.code_is(1);
    assert_eq!(p.read("report.txt"), "warnings\n");
    assert_eq!(field(&attempts(&p, "lint"), "class"), ["ok"]);
    assert!(
        run.stderr()
            .contains("command succeeded but did not create declared output `0` (missing.txt)"),
        "{}",
        run.stderr()
    );
    assert_eq!(field(&attempts(&p, "broken"), "class"), ["error"]);
}

#[test]
fn adding_classify_rules_to_a_plain_stage_reruns_it_and_none_keeps_it_fresh() {
    let p = flaky(0, "", "", "{ max = 0 }");
    p.cairn(&["run"]).success();
    // A stage without rules keeps its fingerprint whatever `retry` says.
    let manifest = p.read("cairn.toml");
    p.file("cairn.toml", &manifest.replace("max = 0", "max = 5"));
    let run = p.cairn(&["run"]);
    assert!(run.stderr().contains("0 ran"), "{}", run.stderr());
    // Rules change what counts as success: the stage runs again.
    p.file(
        "cairn.toml",
        &manifest.replace(
            "classify = []",
            r#"classify = [{ exit = 75, as = "infra" }]"#,
        ),
    );
    let why = p.cairn(&["why", "fetch"]);
    assert!(why.stdout().contains("classify"), "{}", why.stdout());
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("attempts.log").len(), 2);
}

#[test]
fn attempt_numbers_count_failures_that_never_started_a_job() {
    // Run 1 cannot start the command (the program is missing); run 2
    // fails twice on infrastructure; run 3 is the command's fourth
    // attempt under its fingerprint, and says so.
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "numbers"

[stages.fetch]
run = ["./fetch.sh"]
outputs = ["data.txt"]
classify = [{ exit = 75, as = "infra" }]
retry = { max = 1 }
"#,
    );
    p.cairn(&["run"]).code_is(1);
    let script = "#!/bin/sh\necho $CAIRN_ATTEMPT >> attempts.log\n[ -f ok ] || exit 75\necho data > data.txt\n";
    p.file("fetch.sh", script);
    std::fs::set_permissions(
        p.path("fetch.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    p.cairn(&["run"]).code_is(1);
    assert_eq!(p.lines("attempts.log"), ["2", "3"]);
    p.file("ok", "");
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("attempts.log"), ["2", "3", "4"]);
}
