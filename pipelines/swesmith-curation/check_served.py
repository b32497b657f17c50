#!/usr/bin/env python3
"""check_served.py MODELS PROFILE: the model server's check, before any
canary trial: every model declared in MODELS is served at
$OPENAI_BASE_URL under its name from its checkpoint, whose weights,
tokenizer and chat template have the declared digests (as digests.py
computes them), at the context length of the canary's evaluation profile
PROFILE (`selection-32k`: 32,768). The agreement is per profile: the
trainer's context is checked against the training profile, not here.
Exits 1 with every problem found."""

import json
import os
import sys
import urllib.request

from common import agent_profile, declared_models
from digests import checkpoint_digests


def get_json(url, timeout=30):
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return json.loads(answer.read())


def check_served(models_path, profile_path):
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    served = {m["id"]: m for m in get_json(base + "/models")["data"]}
    profile = agent_profile(profile_path)
    agent = profile["max_context"]
    problems = []
    for name, declared in declared_models(models_path).items():
        model = served.get(declared["served_name"])
        if model is None:
            problems.append(f"{name}: `{declared['served_name']}` is not served (served: {', '.join(sorted(served)) or 'nothing'})")
            continue
        root = model.get("root")
        if not root or not os.path.isdir(root):
            problems.append(f"{name}: the server loads it from `{root}`, which this machine cannot read to verify")
            continue
        mine = []
        if os.path.realpath(root) != os.path.realpath(declared["checkpoint"]):
            mine.append(f"{name}: served from {root}, declared {declared['checkpoint']}")
        found = checkpoint_digests(root)
        for key, value in found.items():
            if value != declared[key]:
                mine.append(f"{name}: {key} is {value}, declared {declared[key]}")
        if model.get("max_model_len") != agent:
            mine.append(f"{name}: context length disagrees: server {model.get('max_model_len')}, "
                        f"profile {profile['name']} {agent}")
        if mine:
            problems.extend(mine)
        else:
            print(f"{name}: served as {model['id']} from {root}, digests as declared, context {agent} as {profile['name']} needs")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    check_served(*sys.argv[1:])
