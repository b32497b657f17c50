#!/usr/bin/env python3
"""check_served.py MODELS SERVER: the model server's check, before any
canary trial: the server SERVER (`MODEL.PROFILE`, one model at one
evaluation profile's context) serves, at $OPENAI_BASE_URL, the model MODEL
declared in MODELS under its name from its checkpoint, whose weights,
tokenizer and chat template have the declared digests, with the context
length the profile is named for (`official-32k`: 32,768; `hardened-64k`:
65,536), neither less nor more. Exits 1 with every problem found."""

import json
import os
import sys
import urllib.request

from canary_common import checkpoint_digests, declared_models, server_parts


def check_served(models_path, server):
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    with urllib.request.urlopen(base + "/models", timeout=30) as answer:
        served = {m["id"]: m for m in json.loads(answer.read())["data"]}
    only, name, context = server_parts(server)
    problems = []
    declared_all = declared_models(models_path)
    if only not in declared_all:
        sys.exit(f"{only} is not declared in {models_path}")
    for model_name, declared in declared_all.items():
        if model_name != only:
            continue
        model = served.get(declared["served_name"])
        if model is None:
            problems.append(f"{model_name}: `{declared['served_name']}` is not served (served: {', '.join(sorted(served)) or 'nothing'})")
            continue
        root = model.get("root")
        if not root or not os.path.isdir(root):
            problems.append(f"{model_name}: the server loads it from `{root}`, which this machine cannot read to verify")
            continue
        mine = [f"{model_name}: {key} is {value}, declared {declared[key]}"
                for key, value in checkpoint_digests(root).items() if value != declared[key]]
        if model.get("max_model_len") != context:
            mine.append(f"{model_name}: served with context {model.get('max_model_len')}, the profile {name} needs {context}")
        problems.extend(mine)
        if not mine:
            print(f"{model_name}: served as {model['id']} from {root}, digests as declared, context {context} ({name})")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    check_served(*sys.argv[1:])
