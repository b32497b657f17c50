//! What a newcomer runs: the README's example and the shipped pipeline.

mod common;

use common::Project;

fn readme_manifest() -> String {
    let readme = include_str!("../README.md");
    let start = readme.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let end = start + readme[start..].find("```").expect("closed block");
    readme[start..end].to_owned()
}

#[test]
fn the_readme_example_runs_skips_cuts_off_and_explains() {
    let p = Project::new();
    p.file("cairn.toml", &readme_manifest());
    p.file("data/book.txt", "the cat and the hat and the bat\n");
    p.file(
        "report.py",
        "import sys\nrows = open(sys.argv[1]).read().split('\\n')\nopen(sys.argv[2], 'w').write('# top words\\n' + '\\n'.join(r.strip() for r in rows if r) + '\\n')\n",
    );
    let first = p.cairn(&["run"]);
    first.success();
    assert!(
        first.stderr().contains("3 ran, 0 fresh"),
        "{}",
        first.stderr()
    );
    assert!(
        p.read("state/report.md").contains("3 the"),
        "{}",
        p.read("state/report.md")
    );

    let second = p.cairn(&["run"]);
    assert!(
        second.stderr().contains("0 ran, 3 fresh"),
        "{}",
        second.stderr()
    );

    // Same words in another order: `count` re-runs, its output is
    // byte-identical, nothing downstream runs.
    p.file("data/book.txt", "and the cat the hat and bat the\n");
    let third = p.cairn(&["run"]);
    assert!(
        third.stderr().contains("1 ran, 2 fresh"),
        "{}",
        third.stderr()
    );

    p.file(
        "cairn.toml",
        &readme_manifest().replace("top = 10", "top = 2"),
    );
    let why = p.cairn(&["why", "top"]);
    assert!(why.stdout().contains("param:top"), "{}", why.stdout());
    assert!(
        why.stdout().contains("- 10") && why.stdout().contains("+ 2"),
        "{}",
        why.stdout()
    );
}

#[test]
fn the_shipped_pipeline_runs_end_to_end_then_is_a_no_op() {
    common::require_tool("python3");
    let p = Project::new();
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines");
    p.file(
        "pipelines/mini-curation.toml",
        &std::fs::read_to_string(format!("{src}/mini-curation.toml")).unwrap(),
    );
    p.file(
        "pipelines/mini-curation/curate.py",
        &std::fs::read_to_string(format!("{src}/mini-curation/curate.py")).unwrap(),
    );
    let first = p.cairn(&["-f", "pipelines/mini-curation.toml", "run"]);
    first.success();
    assert!(first.stderr().contains("6 ran"), "{}", first.stderr());
    assert!(
        p.read("state/mini-curation/report.md")
            .contains("semantic digest: sha256:")
    );
    // The root is the repository's top: the store and ledger are `./cache/`.
    assert!(p.path("cache/objects").is_dir() && !p.exists("pipelines/cache"));
    // The committed lock file is what a fresh run produces.
    assert_eq!(
        p.read("pipelines/mini-curation.lock"),
        std::fs::read_to_string(format!("{src}/mini-curation.lock")).unwrap()
    );
    let second = p.cairn(&["-f", "pipelines/mini-curation.toml", "run"]);
    assert!(
        second.stderr().contains("0 ran, 6 fresh"),
        "{}",
        second.stderr()
    );
    let status = p.cairn(&["-f", "pipelines/mini-curation.toml", "status"]);
    assert!(
        status.stdout().contains("all 6 stage(s) fresh"),
        "{}",
        status.stdout()
    );
}
