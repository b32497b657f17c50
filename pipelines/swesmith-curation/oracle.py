#!/usr/bin/env python3
"""oracle.py TASK RESULT --budget S [--fault-rate F]: one task's oracle, in
a copy of its repository: its test must fail as it is (NOP) and pass once
the gold patch is applied, each run within the budget of S seconds. Writes
RESULT (with the budget) and exits 0 (`accepted`), 3 (`nop-passes`), 4
(`gold-fails`) or 5 (`times-out`: a run took longer than the budget, a
verdict on the task under that budget, which is in its fingerprint). A run
stopped before its budget ran out (the stage's own timeout, a pod killed)
decided nothing about the task: the stage classifies it as
infrastructure. With F > 0, that share of tasks fails its first attempt
as infrastructure (exit 75), as a cluster does when a pod never becomes
ready."""

import json
import os
import shutil
import sys
import tempfile

from common import frac, git_apply, run_tests, write_json


def oracle(args):
    task_dir, result = args[0], args[1]
    fault_rate = float(args[args.index("--fault-rate") + 1]) if "--fault-rate" in args else 0.0
    if "--budget" not in args:
        sys.exit("oracle.py: --budget SECONDS is required: a verdict is made under a stated budget")
    budget = float(args[args.index("--budget") + 1])
    task_id = os.path.basename(os.path.normpath(task_dir))
    attempt = int(os.environ.get("CAIRN_ATTEMPT", "1"))
    if fault_rate > 0 and frac(task_id, "fault") < fault_rate and attempt == 1:
        print("PodReadyTimeout: pod did not become ready in 300s", file=sys.stderr)
        sys.exit(75)
    with open(os.path.join(task_dir, "task.json")) as f:
        meta = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "repo")
        shutil.copytree(os.path.join(task_dir, "repo"), repo)
        nop_passes = run_tests(repo, meta["test"], budget)
        applied = git_apply(repo, os.path.join(task_dir, "gold.patch"))
        if applied.returncode != 0:
            sys.exit("the gold patch does not apply: " + applied.stdout.strip())
        gold_passes = run_tests(repo, meta["test"], budget) if nop_passes is not None else None
    ran = lambda passed: "timeout" if passed is None else "pass" if passed else "fail"
    if nop_passes is None or gold_passes is None:
        verdict = "times-out"
    else:
        verdict = "nop-passes" if nop_passes else "accepted" if gold_passes else "gold-fails"
    write_json(result, {"verdict": verdict, "nop": ran(nop_passes), "gold": ran(gold_passes),
                        "budget_seconds": budget})
    print(verdict)
    sys.exit({"accepted": 0, "nop-passes": 3, "gold-fails": 4, "times-out": 5}[verdict])


if __name__ == "__main__":
    oracle(sys.argv[1:])
