#!/usr/bin/env python3
"""static_check.py TASK_DIR TREE OUT: a candidate's static checks, before
any test runs. The bug applies to the pinned clean tree exactly (`git
apply --check`: no fuzz, no offset guessing), the bugged file compiles,
and the gold patch — the bug reversed — applies to the bugged tree
exactly and gives back the clean tree byte for byte."""

import filecmp
import os
import py_compile
import subprocess
import sys

from common import copy_tree, read_json, temp_dir, write_json


def same_tree(a, b):
    compared = filecmp.dircmp(a, b)
    if compared.left_only or compared.right_only or compared.diff_files or compared.funny_files:
        return False
    return all(same_tree(os.path.join(a, d), os.path.join(b, d)) for d in compared.common_dirs)


def reject(out, reason):
    write_json(out, {"verdict": "static-reject", "reason": reason})
    print(f"static-reject: {reason}")
    sys.exit(1)


def git_apply(tree, patch, *flags):
    return subprocess.run(["git", "apply", *flags, patch], cwd=tree,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def main(task_dir, tree, out):
    bug = os.path.abspath(os.path.join(task_dir, "bug.diff"))
    with temp_dir() as tmp:
        work = os.path.join(tmp, "tree")
        copy_tree(tree, work)
        applied = git_apply(work, bug, "--check")
        if applied.returncode != 0:
            reject(out, f"the bug does not apply exactly: {applied.stdout.strip()}")
        git_apply(work, bug)
        changed = [line[6:].strip() for line in open(bug) if line.startswith("+++ b/")]
        for path in changed:
            try:
                py_compile.compile(os.path.join(work, path), doraise=True, cfile=os.path.join(tmp, "c.pyc"))
            except py_compile.PyCompileError as error:
                reject(out, f"the bugged {path} does not compile: {error.msg.strip().splitlines()[-1]}")
        reverse = git_apply(work, bug, "-R", "--check")
        if reverse.returncode != 0:
            reject(out, f"the gold patch (the bug reversed) does not apply exactly: {reverse.stdout.strip()}")
        git_apply(work, bug, "-R")
        if not same_tree(work, tree):
            reject(out, "the gold patch does not give back the clean tree")
    write_json(out, {"verdict": "accepted", "files": changed})
    print("accepted")


if __name__ == "__main__":
    main(*sys.argv[1:])
