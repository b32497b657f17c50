#!/usr/bin/env python3
"""canary_lists.py RECEIPT TRIALS VAL TRAIN MODELS [IMAGES]: the fixed
canary lists from the registered freeze RECEIPT names: the first VAL tasks
of its validation split and the first TRAIN of its train split, by
`sha256(id)`, one trial per model (MODELS, comma-separated) and task,
each model's first task its smoke task. With IMAGES (the mirror's list),
each trial carries its task's mirrored image `reference`, to run in by
digest. Writes TRIALS."""

import hashlib
import sys

from common import read_jsonl, registered, write_jsonl


def canary_lists(args):
    receipt, trials, n_val, n_train = args[0], args[1], int(args[2]), int(args[3])
    models = args[4].split(",")
    # Each trial runs in its task's mirrored image when the mirror went to
    # a registry (`reference`: pulled by digest); a layout has none.
    images = {r["id"]: r["reference"] for r in read_jsonl(args[5]) if r.get("reference")} if len(args) > 5 else {}
    _, manifest = registered(receipt)
    by_hash = lambda ids: sorted(ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())
    val_split = "val" if "val" in manifest["splits"] else sorted(manifest["splits"])[0]
    val = by_hash(manifest["splits"].get(val_split, []))[:n_val]
    train = by_hash(manifest["splits"].get("train", []))[:n_train]
    lists = [(f"validation{len(val)}", val), (f"train{len(train)}", train)]
    # Each model's first task is its smoke task: run first, and a harness
    # that cannot complete it marks the model, not the canary.
    first = (lists[0][1][:1] or lists[1][1][:1])
    def trial(model, task, name):
        item = {"key": f"{model}:{task}", "model": model, "task": task, "list": name,
                "smoke": task in first}
        if task in images:
            item["reference"] = images[task]
        return item

    write_jsonl(trials, [trial(m, t, name) for m in models for name, tasks in lists for t in tasks])


if __name__ == "__main__":
    canary_lists(sys.argv[1:])
