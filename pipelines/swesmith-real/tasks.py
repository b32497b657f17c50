#!/usr/bin/env python3
"""tasks.py GENERATION_RESULTS OUT_LIST OUT_DIR: every generated bug as a
candidate task: a directory OUT_DIR/ID holding its `bug.diff`, and a line
of OUT_LIST (id, repo, modifier, file, entity), in id order. A bug two
modifiers both made is one task."""

import os
import sys

from common import read_jsonl, write_jsonl


def main(results, out_list, out_dir):
    tasks = {}
    for line in read_jsonl(results):
        if line["class"] != "ok":
            continue
        repo = {k: line["item"][k] for k in ("owner", "project", "version", "sha256", "tests", "pythonpath")}
        for bug in line["result"]["bugs"]:
            tasks.setdefault(bug["id"], {**bug, **repo})
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for task_id in sorted(tasks):
        bug = tasks[task_id]
        os.makedirs(os.path.join(out_dir, task_id))
        with open(os.path.join(out_dir, task_id, "bug.diff"), "w") as f:
            f.write(bug["patch"])
        rows.append({k: v for k, v in bug.items() if k not in ("patch", "hash")})
    write_jsonl(out_list, rows)
    print(f"{len(rows)} candidate tasks")


if __name__ == "__main__":
    main(*sys.argv[1:])
