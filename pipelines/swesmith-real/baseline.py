#!/usr/bin/env python3
"""baseline.py KEY TESTS PYTHONPATH TREE WHEELS REQUIREMENTS TIMEOUT OUT: the
repository's tests on its clean tree, test by test (pytest's JUnit XML,
not its exit code). The gold tree of every task is this tree, so these are
the results FAIL_TO_PASS and PASS_TO_PASS are drawn against. A run that
cannot collect or times out is infrastructure, never a baseline; how long
the clean run took sets the bugged runs' time budget."""

import os
import sys
import time

from common import INFRA, collection_failed, copy_tree, environment_digest, run_tests, temp_dir, venv, write_json


def main(key, tests, pythonpath, tree, wheels, requirements, timeout, out):
    repo = {"tests": tests, "pythonpath": pythonpath}
    python = venv("test", requirements, wheels)
    with temp_dir() as tmp:
        work = os.path.join(tmp, "tree")
        copy_tree(tree, work)
        started = time.monotonic()
        try:
            outcomes, code, output = run_tests(python, work, repo, float(timeout), os.path.join(tmp, "junit.xml"))
        except TimeoutError as error:
            print(f"{key}: {error}", file=sys.stderr)
            sys.exit(INFRA)
    if collection_failed(outcomes, code):
        print(output[-4000:], file=sys.stderr)
        print(f"{key}: the clean tree's tests could not be collected (pytest exit {code})", file=sys.stderr)
        sys.exit(INFRA)
    seconds = round(time.monotonic() - started, 3)
    passed = sorted(t for t, o in outcomes.items() if o == "passed")
    write_json(out, {"repo": key, "tests": outcomes, "passed": len(passed),
                     "not_passed": sorted(t for t, o in outcomes.items() if o != "passed"),
                     "environment": environment_digest(requirements), "seconds": seconds})
    print(f"{key}: {len(outcomes)} tests, {len(passed)} pass on the clean tree")


if __name__ == "__main__":
    main(*sys.argv[1:])
