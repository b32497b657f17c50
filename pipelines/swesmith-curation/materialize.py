#!/usr/bin/env python3
"""materialize.py DIR ID REPO TEMPLATE FUNC DEFECT IMAGE: the task
directory of one planned task, built on the task repository
repos/TEMPLATE: DIR/repo (the package with FUNC's bug, FUNC's test),
DIR/gold.patch (the fix) and DIR/task.json. DEFECT breaks the task on
purpose: `bad-patch` (the gold patch was made against another revision:
its context is wrong), `nop-passes` (the bug is missing: the tests pass
unpatched), `gold-fails` (the gold patch only touches a comment), or
`none`."""

import difflib
import json
import os
import shutil
import sys

from common import write_json

HERE = os.path.dirname(os.path.abspath(__file__))


def materialize(d, task_id, repo, template, func, defect, image):
    task = {"id": task_id, "repo": repo, "template": template, "func": func,
            "defect": defect, "image": image}
    build_task(task, os.path.join(HERE, "repos", template), d)


def build_task(task, template, d):
    name, func = task["template"], task["func"]
    with open(os.path.join(template, "mutations.json")) as f:
        mutation = json.load(f)[func]
    with open(os.path.join(template, "pkg", f"{name}.py")) as f:
        fixed = f.read()
    broken = fixed if task["defect"] == "nop-passes" else \
        fixed.replace(mutation["original"], mutation["mutated"], 1)
    os.makedirs(os.path.join(d, "repo", "pkg"))
    os.makedirs(os.path.join(d, "repo", "tests"))
    with open(os.path.join(d, "repo", "pkg", f"{name}.py"), "w") as f:
        f.write(broken)
    open(os.path.join(d, "repo", "pkg", "__init__.py"), "w").close()
    shutil.copyfile(os.path.join(template, "tests", f"test_{func}.py"),
                    os.path.join(d, "repo", "tests", f"test_{func}.py"))
    # A gold patch that fails only touches a comment.
    target = broken + "\n# reviewed\n" if task["defect"] == "gold-fails" else fixed
    patch = "".join(difflib.unified_diff(
        broken.splitlines(True), target.splitlines(True),
        f"a/pkg/{name}.py", f"b/pkg/{name}.py"))
    if task["defect"] == "bad-patch":
        # A patch made against another revision: its context is wrong.
        patch = patch.replace("\n ", "\n #", 1)
    with open(os.path.join(d, "gold.patch"), "w") as f:
        f.write(patch)
    write_json(os.path.join(d, "task.json"), {
        "id": task["id"], "repo": task["repo"], "image": task["image"],
        "test": f"tests/test_{func}.py", "instance": f"Fix `{func}` in `pkg/{name}.py`.",
    })


if __name__ == "__main__":
    materialize(*sys.argv[1:])
