//! Every kind of bad manifest: exit 2, a located message, and no `cache/`.

mod common;

use common::Project;

/// (name, manifest, expected message fragment, expected `line:col`)
const CASES: &[(&str, &str, &str, &str)] = &[
    (
        "toml syntax",
        "[pipeline]\nname = \"x\n",
        "invalid TOML",
        "cairn.toml:2:",
    ),
    (
        "unknown top-level key",
        "[pipeline]\nname = \"x\"\n[stagez.a]\nrun = \"true\"\n[stages.a]\nrun = \"true\"\n",
        "unknown key `stagez` in top level of the manifest",
        "cairn.toml:3:2",
    ),
    (
        "unknown stage key",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\ninptus = []\n",
        "unknown key `inptus`",
        "cairn.toml:5:1",
    ),
    (
        "bad type for run",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = 5\n",
        "`run` must be a string",
        "cairn.toml:4:7",
    ),
    (
        "missing run",
        "[pipeline]\nname = \"x\"\n[stages.a]\noutputs = [\"o.txt\"]\n",
        "stage `a` has no `run`",
        "cairn.toml:3:9",
    ),
    (
        "missing pipeline name",
        "[pipeline]\n[stages.a]\nrun = \"true\"\n",
        "`[pipeline]` has no `name`",
        "cairn.toml:1:2",
    ),
    (
        "undefined param",
        "[pipeline]\nname = \"x\"\n[params]\nsize = 1\n[stages.a]\nrun = \"echo {params.szie}\"\n",
        "undefined param `szie`",
        "cairn.toml:6:13",
    ),
    (
        "undefined input",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"cat {in.data}\"\n",
        "undefined input `data`",
        "cairn.toml:4:12",
    ),
    (
        "undefined output",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"echo > {out.o}\"\noutputs = { p = \"p.txt\" }\n",
        "undefined output `o`",
        "cairn.toml:4:15",
    ),
    (
        "unknown namespace",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"echo {parms.x}\"\n",
        "unknown placeholder namespace `parms`",
        "cairn.toml:4:13",
    ),
    (
        "cycle through needs",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nneeds = [\"b\"]\n[stages.b]\nrun = \"true\"\nneeds = [\"a\"]\n",
        "dependency cycle: a → b → a",
        "cairn.toml:3:9",
    ),
    (
        "cycle through paths",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\ninputs = [\"b.txt\"]\noutputs = [\"a.txt\"]\n[stages.b]\nrun = \"true\"\ninputs = [\"a.txt\"]\noutputs = [\"b.txt\"]\n",
        "dependency cycle: a → b → a",
        "cairn.toml:3:9",
    ),
    (
        "two stages write one path",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\noutputs = [\"o.txt\"]\n[stages.b]\nrun = \"true\"\noutputs = [\"o.txt\"]\n",
        "stages `a` and `b` both write `o.txt`",
        "cairn.toml:8:12",
    ),
    (
        "nested outputs",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\noutputs = [\"out\"]\n[stages.b]\nrun = \"true\"\noutputs = [\"out/b.txt\"]\n",
        "lies inside output directory `out`",
        "cairn.toml:8:12",
    ),
    (
        "output escapes root",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\noutputs = [\"../escape.txt\"]\n",
        "escapes the project root",
        "cairn.toml:5:12",
    ),
    (
        "absolute output outside root",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\noutputs = [\"/tmp/cairn-elsewhere.txt\"]\n",
        "is outside the project root",
        "cairn.toml:5:12",
    ),
    (
        "missing input",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\ninputs = [\"nope.txt\"]\n",
        "input `nope.txt` of stage `a` does not exist and no stage produces it",
        "cairn.toml:5:11",
    ),
    (
        "needs unknown stage",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nneeds = [\"bulid\"]\n[stages.build]\nrun = \"true\"\n",
        "needs unknown stage `bulid`",
        "cairn.toml:5:10",
    ),
    (
        "profile overrides undefined param",
        "[pipeline]\nname = \"x\"\n[params]\nn = 1\n[profiles.big]\nparams = { m = 2 }\n[stages.a]\nrun = \"true\"\n",
        "profile `big` overrides undefined param `m`",
        "cairn.toml:6:12",
    ),
    (
        "stage declares undefined param",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nparams = [\"n\"]\n",
        "declares undefined param `n`",
        "cairn.toml:5:11",
    ),
    (
        "bad timeout",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\ntimeout = \"soon\"\n",
        "invalid timeout `soon`",
        "cairn.toml:5:11",
    ),
    (
        "empty run",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"  \"\n",
        "empty run command",
        "cairn.toml:4:7",
    ),
    (
        "invalid stage name",
        "[pipeline]\nname = \"x\"\n[stages.\"a b\"]\nrun = \"true\"\n",
        "invalid stage name `a b`",
        "cairn.toml:3:9",
    ),
    (
        "output inside cache",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\noutputs = [\"cache/x\"]\n",
        "inside cairn's `cache/` directory",
        "cairn.toml:5:12",
    ),
    (
        "bad env value",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nenv = { N = 3 }\n",
        "`env.N` must be a string value",
        "cairn.toml:5:13",
    ),
    (
        "no stages",
        "[pipeline]\nname = \"x\"\n",
        "the manifest defines no stages",
        "cairn.toml:1:1",
    ),
    (
        "undeclared resource",
        "[pipeline]\nname = \"x\"\n[resources]\ncluster-window = 1\n[stages.a]\nrun = \"true\"\nresources = [\"cluster-windw\"]\n",
        "holds undeclared resource `cluster-windw`",
        "cairn.toml:7:14",
    ),
    (
        "item placeholder outside a per-item stage",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"echo {item.id}\"\n",
        "`{item.id}` outside a per-item stage",
        "cairn.toml:4:13",
    ),
    (
        "allow_errors without foreach",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nallow_errors = 1\n",
        "`allow_errors` in stage `a`, which is not a per-item stage",
        "cairn.toml:5:1",
    ),
    (
        "a verdict in a plain stage",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nclassify = [ { exit = 1, as = \"rejected\" } ]\n",
        "verdict `rejected` in stage `a`, which is not a per-item stage",
        "cairn.toml:5:12",
    ),
    (
        "a window across a cluster with a name that is not plain",
        "[pipeline]\nname = \"x\"\n[executors.hpc]\nkind = \"slurm\"\n[resources]\n\"../w\" = { capacity = 1, hold = \"stage\", across = \"hpc\" }\n[stages.a]\nrun = \"true\"\n",
        "resource `../w` is held `across` a cluster, but its name is not plain",
        "cairn.toml:6:1",
    ),
    (
        "a result condition in a plain stage",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nclassify = [ { result = \"/status\", equals = \"pass\", as = \"ok\" } ]\n",
        "a `result` condition in stage `a`, which is not a per-item stage",
        "cairn.toml:5:12",
    ),
    (
        "invalid classify regex",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nforeach = { items = \"cairn.toml\", key = \"id\" }\nclassify = [ { output = \"(\", as = \"infra\" } ]\noutputs = [\"r.jsonl\"]\n",
        "invalid regular expression `(`",
        "cairn.toml:6:25",
    ),
    (
        "unknown end in a classify rule",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nforeach = { items = \"cairn.toml\", key = \"id\" }\nclassify = [ { ended = \"out-of-memroy\", as = \"leaks\" } ]\noutputs = [\"r.jsonl\"]\n",
        "unknown end `out-of-memroy`",
        "cairn.toml:6:24",
    ),
    (
        "exit and ended in one classify rule",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nforeach = { items = \"cairn.toml\", key = \"id\" }\nclassify = [ { ended = \"timeout\", exit = 1, as = \"infra\" } ]\noutputs = [\"r.jsonl\"]\n",
        "`exit` and `ended` in one rule",
        "cairn.toml:6:35",
    ),
    (
        "items naming no output",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nforeach = { items = \"{plan.out.list}\", key = \"id\" }\noutputs = [\"r.jsonl\"]\n",
        "`{plan.out.list}` names no output",
        "cairn.toml:5:21",
    ),
    (
        "per-item stage without one output",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nforeach = { items = \"cairn.toml\", key = \"id\" }\n",
        "per-item stage `a` must declare exactly one output",
        "cairn.toml:3:9",
    ),
    (
        "result check without item_result",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nforeach = { items = \"cairn.toml\", key = \"id\" }\nchecks = [ { result = \"/turns\", min = 1 } ]\noutputs = [\"r.jsonl\"]\n",
        "a result check in a stage without `item_result`",
        "cairn.toml:6:12",
    ),
    (
        "result check that is not a JSON pointer",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nforeach = { items = \"cairn.toml\", key = \"id\" }\nitem_result = \"r/{item.id}.json\"\nchecks = [ { result = \"turns\", min = 1 } ]\noutputs = [\"r.jsonl\"]\n",
        "`turns` is not a JSON pointer",
        "cairn.toml:7:23",
    ),
    (
        "zero capacity",
        "[pipeline]\nname = \"x\"\n[resources]\nwindow = 0\n[stages.a]\nrun = \"true\"\n",
        "resource `window` needs a capacity of at least 1",
        "cairn.toml:4:10",
    ),
    (
        "a batch of no items",
        "[pipeline]\nname = \"x\"\n[executors.c]\nkind = \"slurm\"\nbatch = 0\n[stages.a]\nrun = \"true\"\nexecutor = \"c\"\n",
        "`batch` must be an integer of at least 1, found 0",
        "cairn.toml:5:9",
    ),
    (
        "unknown built-in",
        "[pipeline]\nname = \"x\"\n[stages.a]\nuses = \"frezee\"\n",
        "unknown built-in `frezee`",
        "cairn.toml:4:8",
    ),
    (
        "built-in without its input",
        "[pipeline]\nname = \"x\"\n[stages.a]\nuses = \"export\"\noutputs = { bundle = \"b.tar.zst\", sha256 = \"b.sha256\" }\n",
        "built-in `export` needs an input named `freeze`",
        "cairn.toml:4:8",
    ),
    (
        "built-in with a port it does not have",
        "[pipeline]\nname = \"x\"\n[stages.a]\nuses = \"export\"\ninputs = { freeze = \"cairn.toml\", extra = \"cairn.toml\" }\noutputs = { bundle = \"b.tar.zst\", sha256 = \"b.sha256\" }\n",
        "built-in `export` has no input named `extra`",
        "cairn.toml:5:43",
    ),
    (
        "built-in without a required setting",
        "[pipeline]\nname = \"x\"\n[stages.a]\nuses = \"register\"\ninputs = { bundle = \"cairn.toml\", sha256 = \"cairn.toml\" }\noutputs = { receipt = \"r.json\" }\n",
        "built-in `register` needs `with.into`",
        "cairn.toml:4:1",
    ),
    (
        "built-in setting of the wrong type",
        "[pipeline]\nname = \"x\"\n[stages.a]\nuses = \"export\"\ninputs = { freeze = \"cairn.toml\" }\noutputs = { bundle = \"b.tar.zst\", sha256 = \"b.sha256\" }\nwith = { level = 40 }\n",
        "`with.level` must be an integer from 1 to 19",
        "cairn.toml:7:18",
    ),
    (
        "unsafe dataset name",
        "[pipeline]\nname = \"x\"\n[stages.a]\nuses = \"freeze\"\ninputs = { selection = \"cairn.toml\", items = \"cairn.toml\" }\noutputs = { freeze = \"f\" }\nwith = { name = \"../up\", version = \"1\" }\n",
        "`with.name` is `../up`, which is not a safe name",
        "cairn.toml:7:17",
    ),
    (
        "both run and uses",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nuses = \"export\"\n",
        "stage `a` has both `run` and `uses`",
        "cairn.toml:5:1",
    ),
    (
        "resource held in an unknown way",
        "[pipeline]\nname = \"x\"\n[resources]\nwindow = { capacity = 1, hold = \"sometimes\" }\n[stages.a]\nrun = \"true\"\n",
        "`hold` must be \"command\" or \"stage\"",
        "cairn.toml:4:33",
    ),
    (
        "item output naming no output",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nforeach = { items = \"cairn.toml\", key = \"id\" }\nitem_outputs = { tasks = \"{item.id}\" }\noutputs = [\"r.jsonl\"]\n",
        "item output `tasks` names no output of stage `a`",
        "cairn.toml:6:18",
    ),
    (
        "unclosed placeholder",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"cat {in.x > out\"\ninputs = { x = \"cairn.toml\" }\n",
        "unclosed placeholder `{in.x`",
        "cairn.toml:4:12",
    ),
    (
        "unclosed placeholder at the end",
        "[pipeline]\nname = \"x\"\n[params]\nn = 1\n[stages.a]\nrun = \"seq {params.n\"\n",
        "unclosed placeholder `{params.n`",
        "cairn.toml:6:12",
    ),
    (
        "placeholder inside backquotes",
        "[pipeline]\nname = \"x\"\n[params]\nn = 1\n[stages.a]\nrun = \"echo `seq {params.n}`\"\n",
        "inside backquotes",
        "cairn.toml:6:18",
    ),
    (
        "with without uses",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nwith = { level = 3 }\n",
        "`with` in a stage without `uses`",
        "cairn.toml:5:1",
    ),
];

#[test]
fn each_bad_manifest_is_refused_with_a_located_error_and_no_cache() {
    assert!(CASES.len() >= 15);
    let mut failures = Vec::new();
    for (name, manifest, fragment, location) in CASES {
        let p = Project::new();
        p.file("cairn.toml", manifest);
        for args in [&["run"][..], &["status"][..]] {
            let run = p.cairn(args);
            let stderr = run.stderr();
            if run.code() != 2 || !stderr.contains(fragment) || !stderr.contains(location) {
                failures.push(format!(
                    "{name} ({args:?}): exit {}; expected `{fragment}` at `{location}`\n{stderr}",
                    run.code()
                ));
            }
            if p.exists("cache") || p.exists("cairn.lock") {
                failures.push(format!("{name}: something was written"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_manifest_that_is_not_utf8_is_a_located_error() {
    let p = Project::new();
    let mut bytes = b"[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"echo caf".to_vec();
    bytes.extend_from_slice(&[0xe9, b'"', b'\n']);
    std::fs::write(p.path("cairn.toml"), bytes).unwrap();
    for args in [&["run"][..], &["status"][..]] {
        let run = p.cairn(args);
        run.code_is(2);
        assert!(
            run.stderr().contains("cairn.toml:4:16") && run.stderr().contains("not UTF-8"),
            "{}",
            run.stderr()
        );
        assert!(!p.exists("cache"));
    }
}

#[test]
fn all_problems_of_a_manifest_are_reported_at_once() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"cat {in.x}\"\nfoo = 1\n[stages.b]\nrun = 3\ninputs = [\"missing.txt\"]\n",
    );
    let run = p.cairn(&["run"]);
    run.code_is(2);
    let stderr = run.stderr();
    for fragment in [
        "undefined input `x`",
        "unknown key `foo`",
        "`run` must be a string",
        "input `missing.txt`",
        "4 problems",
    ] {
        assert!(
            stderr.contains(fragment),
            "missing `{fragment}` in\n{stderr}"
        );
    }
}

#[test]
fn errors_carry_a_caret_excerpt_and_a_hint() {
    let p = Project::new();
    p.file("cairn.toml", "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"true\"\nneeds = [\"bulid\"]\n[stages.build]\nrun = \"true\"\n");
    let stderr = p.cairn(&["run"]).stderr();
    assert!(stderr.contains("needs = [\"bulid\"]"), "{stderr}");
    assert!(stderr.contains("did you mean `build`?"), "{stderr}");
}

#[test]
fn unknown_profile_and_unknown_target_are_usage_errors() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        "[pipeline]\nname = \"x\"\n[profiles.small]\n[stages.a]\nrun = \"true\"\n",
    );
    let run = p.cairn(&["run", "--profile", "huge"]);
    run.code_is(2);
    assert!(
        run.stderr()
            .contains("unknown profile `huge` (defined: small)"),
        "{}",
        run.stderr()
    );
    let run = p.cairn(&["run", "b"]);
    run.code_is(2);
    assert!(
        run.stderr().contains("no stage named `b`"),
        "{}",
        run.stderr()
    );
    let run = p.cairn(&["-f", "missing.toml", "status"]);
    run.code_is(2);
    assert!(
        run.stderr().contains("no manifest at `missing.toml`"),
        "{}",
        run.stderr()
    );
    assert!(!p.exists("cache"));
}

#[test]
fn shell_braces_are_not_placeholders() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"echo ${HOME:+set} | awk '{print $1}' > {out.o}\"\noutputs = { o = \"o.txt\" }\n",
    );
    p.cairn(&["run"]).success();
    assert_eq!(p.read("o.txt"), "set\n");
}

/// A path refused is reported once: the `{out.NAME}` and `{in.NAME}`
/// that name it are not reported again as undefined.
#[test]
fn a_refused_path_is_not_reported_again_as_undefined_where_it_is_used() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        "[pipeline]\nname = \"x\"\n[stages.a]\nrun = \"cat {in.i} > {out.o}\"\ninputs = { i = \"\" }\noutputs = { o = \"../outside.txt\" }\n",
    );
    let run = p.cairn(&["run"]);
    run.code_is(2);
    let stderr = run.stderr();
    assert!(stderr.contains("escapes the project root"), "{stderr}");
    assert!(stderr.contains("2 problems"), "{stderr}");
    assert!(!stderr.contains("undefined"), "{stderr}");
    assert!(!p.exists("cache"));
}
