#!/usr/bin/env python3
"""static_check.py TASK RESULT: the static checks of one task directory,
before any test runs: its task.json reads, its test compiles, and its gold
patch applies to its repository exactly (`git apply --check`: no fuzz).
Writes RESULT (`ok` and the problems found); a task with problems exits 1,
printing `static-reject:` and them."""

import json
import os
import shutil
import sys
import tempfile

from common import git_apply, write_json


def static_check(task_dir, result):
    problems = []
    try:
        with open(os.path.join(task_dir, "task.json")) as f:
            meta = json.load(f)
        test = os.path.join(task_dir, "repo", meta["test"])
        with open(test) as f:
            compile(f.read(), test, "exec")
    except (OSError, ValueError, KeyError, SyntaxError) as e:
        problems.append(f"task metadata or test unreadable: {e}")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(task_dir, "repo"), os.path.join(tmp, "repo"))
        applied = git_apply(os.path.join(tmp, "repo"), os.path.join(task_dir, "gold.patch"), "--check")
        if applied.returncode != 0:
            problems.append("gold patch does not apply: " + applied.stdout.strip()[:200])
    write_json(result, {"ok": not problems, "problems": problems})
    if problems:
        print("static-reject:", "; ".join(problems))
        sys.exit(1)


if __name__ == "__main__":
    static_check(*sys.argv[1:])
