#!/usr/bin/env python3
"""validate.py ID REPO OWNER PROJECT VERSION PIN TESTS PYTHONPATH MODIFIER FILE ENTITY TASK_DIR TREE BASELINE WHEELS REQUIREMENTS TIMEOUT OUT RESULT:
a task graded as SWE-bench grades it. The repository's tests run on the
bugged tree and are read test by test (JUnit XML); against the clean
(gold) tree's results: FAIL_TO_PASS are the tests that pass on the gold
tree and fail on the bugged one, PASS_TO_PASS those that pass on both. A
task with an empty FAIL_TO_PASS is rejected (`no-fail-to-pass`). A bugged
tree whose tests cannot be collected, or run past their budget (TIMEOUT
seconds, or five times the clean tree's run if that is longer: the bug made
a loop endless, the machine is not slow), cannot be graded (`error`, never
a verdict); a test run that fails to start is infrastructure (retried). The accepted task's directory holds its bug, its gold
patch and its record (OUT), whatever the verdict."""

import difflib
import os
import shutil
import subprocess
import sys

from common import INFRA, UNGRADABLE, collection_failed, copy_tree, read_json, run_tests, temp_dir, venv, write_json


def main(task_id, repo_key, owner, project, version, pin, tests, pythonpath, modifier, file, entity,
         task_dir, tree, baseline_path, wheels, requirements, timeout, out, result):
    task = {"id": task_id, "repo": repo_key, "modifier": modifier, "file": file, "entity": entity}
    repo = {"owner": owner, "project": project, "version": version, "sha256": pin,
            "tests": tests, "pythonpath": pythonpath}
    baseline = read_json(baseline_path)
    bug = os.path.abspath(os.path.join(task_dir, "bug.diff"))
    python = venv("test", requirements, wheels)
    with temp_dir() as tmp:
        work = os.path.join(tmp, "tree")
        copy_tree(tree, work)
        subprocess.run(["git", "apply", bug], cwd=work, check=True)
        budget = max(float(timeout), 5 * baseline["seconds"])
        try:
            outcomes, code, output = run_tests(python, work, repo, budget, os.path.join(tmp, "junit.xml"))
        except TimeoutError as error:
            print(f"{task['id']}: {error} (the clean tree's took {baseline['seconds']} s): ungradable", file=sys.stderr)
            sys.exit(UNGRADABLE)
        except OSError as error:
            print(f"{task['id']}: the tests could not be started: {error}", file=sys.stderr)
            sys.exit(INFRA)
        if collection_failed(outcomes, code) and code != 1:
            print(output[-3000:], file=sys.stderr)
            print(f"{task['id']}: the bugged tree's tests could not be collected (pytest exit {code}): ungradable", file=sys.stderr)
            sys.exit(UNGRADABLE)
        # The gold patch: the bug reversed, made from the two trees.
        gold = []
        for path in sorted({line[6:].strip() for line in open(bug) if line.startswith("+++ b/")}):
            with open(os.path.join(work, path)) as f:
                bugged = f.readlines()
            with open(os.path.join(tree, path)) as f:
                clean = f.readlines()
            gold.extend(difflib.unified_diff(bugged, clean, f"a/{path}", f"b/{path}"))
    gold_passed = {t for t, o in baseline["tests"].items() if o == "passed"}
    fail_to_pass = sorted(t for t in gold_passed if outcomes.get(t, "failed") in ("failed", "error"))
    pass_to_pass = sorted(t for t in gold_passed if outcomes.get(t) == "passed")
    verdict = "accepted" if fail_to_pass else "no-fail-to-pass"
    record = {"instance_id": task["id"], "repo": f"{repo['owner']}/{repo['project']}",
              "pin": {"project": repo["project"], "version": repo["version"], "sha256": repo["sha256"]},
              "modifier": task["modifier"], "file": task["file"], "entity": task["entity"],
              "FAIL_TO_PASS": fail_to_pass, "PASS_TO_PASS": pass_to_pass,
              "environment": baseline["environment"], "graded_by": "pytest JUnit XML, test by test",
              "verdict": verdict}
    write_json(result, {"verdict": verdict, "fail_to_pass": len(fail_to_pass), "pass_to_pass": len(pass_to_pass)})
    os.makedirs(out, exist_ok=True)
    shutil.copy(bug, os.path.join(out, "bug.diff"))
    with open(os.path.join(out, "gold.diff"), "w") as f:
        f.writelines(gold)
    write_json(os.path.join(out, "task.json"), record)
    print(f"{task['id']}: {verdict}, FAIL_TO_PASS {len(fail_to_pass)}, PASS_TO_PASS {len(pass_to_pass)}")
    sys.exit(0 if verdict == "accepted" else 3)


if __name__ == "__main__":
    main(*sys.argv[1:])
