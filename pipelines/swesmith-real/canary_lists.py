#!/usr/bin/env python3
"""The canary's pinned task lists.

    canary_lists.py RECEIPT REPOS LISTS DECLARED MODELS PROFILES_DIR PROFILES TRIALS NAME=SHA256...

checks each list LISTS/NAME.txt (one task id a line) against the SHA-256
the manifest pins it by, and against the registered freeze RECEIPT names
(every task in it, in the split the list is for: `validation…` lists the
`val` split, `train…` the `train` split), then writes TRIALS: one trial per
evaluation profile (PROFILES, comma-separated, each PROFILES_DIR/NAME.yaml,
its name ending in its context size), model (MODELS, comma-separated) and
task, each carrying its profile, the model server it needs (the model at
the profile's context: `model-a.official-32k`), its list, its
repository (REPOS: where its clean tree is and how its tests run), its
model's checkpoint as DECLARED (revision and weights digest: a new
checkpoint is a new trial, the other models' samples are kept) and whether
it is its server's smoke task (the first task of the first list).
A list that does not match its digest, or names a task outside the
freeze, stops the canary before any trial.

    canary_lists.py make RECEIPT PLANNED LISTS TRAIN

writes the lists of a new freeze: `validationN.txt`, every validation task,
and `trainTRAIN.txt`, the first TRAIN train tasks by (priority,
sha256(task id)), a task's priority its plan stage (A before B, from
PLANNED); prints their digests, to pin in the manifest."""

import hashlib
import os
import sys

from canary_common import declared_models, profile_context, server_name
from common import read_json, read_jsonl, write_jsonl

SPLITS = {"validation": "val", "train": "train"}


def registered_manifest(receipt):
    registered = read_json(receipt)
    return read_json(os.path.join(registered["registry"], registered["name"], registered["version"],
                                  "manifest.json"))


def split_of(name):
    for prefix, split in SPLITS.items():
        if name.startswith(prefix):
            return split
    sys.exit(f"canary list `{name}`: its name must say its split (`validation…` or `train…`)")


def read_list(lists, name, pinned, manifest):
    path = os.path.join(lists, f"{name}.txt")
    with open(path, "rb") as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != pinned:
        sys.exit(f"canary list `{path}` has SHA-256 {digest}, but the manifest pins {pinned}: "
                 "the list changed; review it, then pin its new digest")
    tasks = [line.strip() for line in data.decode().splitlines() if line.strip() and not line.startswith("#")]
    split = split_of(name)
    outside = [t for t in tasks if t not in manifest["items"]]
    if outside:
        sys.exit(f"canary list `{path}` names {len(outside)} task(s) outside the registered freeze "
                 f"{manifest['name']} {manifest['version']}: {', '.join(outside[:5])}")
    elsewhere = [t for t in tasks if manifest["items"][t]["split"] != split]
    if elsewhere:
        sys.exit(f"canary list `{path}` is for the `{split}` split, but names tasks of another: "
                 f"{', '.join(t + ' (' + manifest['items'][t]['split'] + ')' for t in elsewhere[:5])}")
    if len(set(tasks)) != len(tasks):
        sys.exit(f"canary list `{path}` names a task twice")
    return tasks


def profiles_named(profiles_dir, names):
    """Each profile named, checked to exist and to say its context."""
    named = [n for n in names.split(",") if n]
    if not named:
        sys.exit("no evaluation profile named (`canary_profiles`)")
    for name in named:
        path = os.path.join(profiles_dir, f"{name}.yaml")
        if not os.path.isfile(path):
            have = sorted(os.path.splitext(n)[0] for n in os.listdir(profiles_dir) if n.endswith(".yaml"))
            sys.exit(f"evaluation profile `{name}`: there is no {path} (profiles: {', '.join(have)})")
        profile_context(path)
    if len(set(named)) != len(named):
        sys.exit(f"an evaluation profile is named twice in `{names}`")
    return named


def trials(receipt, repos_path, lists, declared_path, models, profiles_dir, profiles, out, *pins):
    manifest = registered_manifest(receipt)
    profiles = profiles_named(profiles_dir, profiles)
    declared = declared_models(declared_path)
    unknown = [m for m in models.split(",") if m not in declared]
    if unknown:
        sys.exit(f"canary models {', '.join(unknown)} are not declared in {declared_path}")
    repos = {r["key"]: r for r in read_jsonl(repos_path)}
    named = []
    for pin in pins:
        name, _, digest = pin.partition("=")
        named.append((name, read_list(lists, name, digest, manifest)))
    smoke = next((tasks[0] for _, tasks in named if tasks), None)
    rows = []
    for profile in profiles:
        for model in models.split(","):
            for name, tasks in named:
                for task in tasks:
                    repo = repos[manifest["items"][task]["group"]]
                    rows.append({"key": f"{profile}:{model}:{task}", "profile": profile,
                                 "server": server_name(model, profile), "model": model, "task": task, "list": name,
                                 "repo": repo["key"], "tests": repo["tests"], "pythonpath": repo["pythonpath"],
                                 "revision": declared[model]["revision"],
                                 "weights_sha256": declared[model]["weights_sha256"],
                                 "smoke": task == smoke})
    write_jsonl(out, rows)
    print(", ".join(f"{name}: {len(tasks)} tasks" for name, tasks in named)
          + f"; {len(rows)} trials over {len(models.split(','))} models and the profiles {', '.join(profiles)}")


def make(receipt, planned, lists, n_train):
    manifest = registered_manifest(receipt)
    stage = {row["id"]: row.get("stage", "") for row in read_jsonl(planned)}
    by_hash = lambda t: hashlib.sha256(t.encode()).hexdigest()
    validation = sorted(manifest["splits"].get("val", []), key=by_hash)
    train = sorted(manifest["splits"].get("train", []), key=lambda t: (stage.get(t, ""), by_hash(t)))[:int(n_train)]
    os.makedirs(lists, exist_ok=True)
    for name, tasks in ((f"validation{len(validation)}", validation), (f"train{len(train)}", train)):
        path = os.path.join(lists, f"{name}.txt")
        with open(path, "w") as f:
            f.write("".join(t + "\n" for t in tasks))
        with open(path, "rb") as f:
            print(f"{name}={hashlib.sha256(f.read()).hexdigest()}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["make"]:
        make(*sys.argv[2:])
    else:
        trials(*sys.argv[1:])
