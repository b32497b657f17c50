#!/usr/bin/env python3
"""Steps of the mini curation pipeline (pipelines/mini-curation.toml).

A small, deterministic stand-in for the SWE-task curation workflow: generate
a candidate pool, plan a selection, materialize task directories, filter
them, split by repository, and report. Standard library only.
"""

import hashlib
import json
import os
import random
import sys


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def generate(count, seed, out):
    rng = random.Random(seed)
    repos = [f"owner{i}__repo{i}" for i in range(24)]
    models = ["gpt-4o", "claude-3.5", "claude-3.7"]
    with open(out, "w") as f:
        for n in range(count):
            repo = rng.choice(repos)
            commit = f"{rng.getrandbits(32):08x}"
            task = f"{repo}.{commit}.mutation_{n}__{rng.getrandbits(40):010x}"
            record = {
                "task_id": task,
                "repo": repo,
                "tier": rng.choice([1, 1, 2, 2, 2, 3, 4]),
                "models": sorted(rng.sample(models, rng.randint(0, 3))),
                "broken": rng.random() < 0.08,
            }
            f.write(json.dumps(record, sort_keys=True) + "\n")


def plan(pool, target, repo_cap, out):
    candidates = [json.loads(line) for line in open(pool)]
    preference = {"gpt-4o": 0, "claude-3.5": 1, "claude-3.7": 2}

    def order(c):
        best = min((preference[m] for m in c["models"]), default=9)
        return (c["tier"], best, sha(c["task_id"]))

    chosen, per_repo = [], {}
    for c in sorted(candidates, key=order):
        if len(chosen) == target:
            break
        if per_repo.get(c["repo"], 0) < repo_cap:
            per_repo[c["repo"]] = per_repo.get(c["repo"], 0) + 1
            chosen.append(c)
    result = {"selected": chosen, "shortfall": target - len(chosen)}
    json.dump(result, open(out, "w"), indent=1, sort_keys=True)


def materialize(plan_path, out_dir):
    tasks = json.load(open(plan_path))["selected"]
    for t in tasks:
        d = os.path.join(out_dir, t["task_id"])
        os.makedirs(d)
        with open(os.path.join(d, "task.json"), "w") as f:
            json.dump(t, f, sort_keys=True, indent=1)
        with open(os.path.join(d, "test_patch.py"), "w") as f:
            body = "assert False  # broken\n" if t["broken"] else "assert True\n"
            f.write(f"# tests for {t['task_id']}\n{body}")


def static_filter(tasks_dir, out):
    with open(out, "w") as f:
        for name in sorted(os.listdir(tasks_dir)):
            test = open(os.path.join(tasks_dir, name, "test_patch.py")).read()
            verdict = "rejected" if "broken" in test else "accepted"
            f.write(json.dumps({"task_id": name, "verdict": verdict}) + "\n")


def split(verdicts, plan_path, val_share, out):
    accepted = {json.loads(l)["task_id"] for l in open(verdicts) if '"accepted"' in l}
    tasks = [t for t in json.load(open(plan_path))["selected"] if t["task_id"] in accepted]
    repos = sorted({t["repo"] for t in tasks}, key=sha)
    n_val = max(1, round(len(repos) * val_share))
    val_repos = set(repos[:n_val])
    splits = {"train": [], "val": []}
    for t in tasks:
        splits["val" if t["repo"] in val_repos else "train"].append(t["task_id"])
    for ids in splits.values():
        ids.sort()
    json.dump(splits, open(out, "w"), indent=1, sort_keys=True)


def report(splits_path, out):
    splits = json.load(open(splits_path))
    canonical = json.dumps(splits, sort_keys=True, separators=(",", ":"))
    lines = ["# mini-curation report", ""]
    for name, ids in sorted(splits.items()):
        lines.append(f"- {name}: {len(ids)} tasks")
    lines.append(f"- semantic digest: sha256:{sha(canonical)}")
    open(out, "w").write("\n".join(lines) + "\n")


def check_plan(path):
    result = json.load(open(path))
    ids = [t["task_id"] for t in result["selected"]]
    if len(ids) != len(set(ids)):
        sys.exit("duplicate task ids in plan")
    if result["shortfall"] > 0:
        sys.exit(f"plan is short by {result['shortfall']} tasks")


if __name__ == "__main__":
    step, args = sys.argv[1], sys.argv[2:]
    {
        "generate": lambda: generate(int(args[0]), int(args[1]), args[2]),
        "plan": lambda: plan(args[0], int(args[1]), int(args[2]), args[3]),
        "materialize": lambda: materialize(args[0], args[1]),
        "static-filter": lambda: static_filter(args[0], args[1]),
        "split": lambda: split(args[0], args[1], float(args[2]), args[3]),
        "report": lambda: report(args[0], args[1]),
        "check-plan": lambda: check_plan(args[0]),
    }[step]()
