#!/usr/bin/env python3
"""tasks.py GENERATION_RESULTS REPOS OUT_LIST: every generated bug as a
candidate task, a line of OUT_LIST (id, repo, stage, modifier, file,
entity, the pin), in id order. A task's stage is its repository's
(REPOS); its diff is where `generate` wrote it,
bugs/REPO.MODIFIER/ID/bug.diff."""

import sys

from common import read_jsonl, write_jsonl


def main(results, repos, out_list):
    stages = {r["key"]: r["stage"] for r in read_jsonl(repos)}
    tasks = {}
    for line in read_jsonl(results):
        if line["class"] != "ok":
            continue
        repo = {k: line["item"][k] for k in ("owner", "project", "version", "sha256", "tests", "pythonpath")}
        for bug in line["result"]["bugs"]:
            tasks.setdefault(bug["id"], {**bug, **repo, "stage": stages[bug["repo"]]})
    rows = [{k: v for k, v in tasks[task_id].items() if k != "hash"} for task_id in sorted(tasks)]
    write_jsonl(out_list, rows)
    print(f"{len(rows)} candidate tasks")


if __name__ == "__main__":
    main(*sys.argv[1:])
