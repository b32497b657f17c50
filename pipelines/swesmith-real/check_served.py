#!/usr/bin/env python3
"""check_served.py MODELS PROFILE [NAME]: the model server's check, before
any canary trial: every model declared in MODELS (or NAME alone, for a
server of one model) is served at $OPENAI_BASE_URL
under its name from its checkpoint, whose weights, tokenizer and chat
template have the declared digests, with the context length the evaluation
profile PROFILE is named for (`official-32k`: 32,768). Exits 1 with every
problem found."""

import json
import os
import sys
import urllib.request

from canary_common import checkpoint_digests, declared_models, profile_context


def check_served(models_path, profile, only=None):
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    with urllib.request.urlopen(base + "/models", timeout=30) as answer:
        served = {m["id"]: m for m in json.loads(answer.read())["data"]}
    name, context = profile_context(profile)
    problems = []
    declared_all = declared_models(models_path)
    if only is not None and only not in declared_all:
        sys.exit(f"{only} is not declared in {models_path}")
    for model_name, declared in declared_all.items():
        if only is not None and model_name != only:
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
