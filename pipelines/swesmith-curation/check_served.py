#!/usr/bin/env python3
"""check_served.py MODELS AGENT TRAINER: the model server's check, before
any canary trial: every model declared in MODELS is served at
$OPENAI_BASE_URL under its name from its checkpoint, whose weights,
tokenizer and chat template have the declared digests (as digests.py
computes them), and the served context length agrees with the agent
profile (AGENT) and the trainer's config (TRAINER). Exits 1 with every
problem found."""

import json
import os
import sys
import urllib.request

from common import agent_profile, declared_models, trainer_context
from digests import checkpoint_digests


def get_json(url, timeout=30):
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return json.loads(answer.read())


def check_served(models_path, agent_path, trainer_path):
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    served = {m["id"]: m for m in get_json(base + "/models")["data"]}
    agent = agent_profile(agent_path)["max_context"]
    trainer = trainer_context(trainer_path)
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
        lengths = {"server": model.get("max_model_len"), "agent": agent, "trainer": trainer}
        if len(set(lengths.values())) != 1:
            mine.append(f"{name}: context length disagrees: " + ", ".join(f"{k} {v}" for k, v in lengths.items()))
        if mine:
            problems.extend(mine)
        else:
            print(f"{name}: served as {model['id']} from {root}, digests as declared, context {agent} everywhere")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    check_served(*sys.argv[1:])
