#!/usr/bin/env python3
"""generate.py REPO OWNER PROJECT PIN SOURCE MODIFIER TREE WHEELS REQUIREMENTS SEED LIMIT OUT BUGS:
candidate bugs in one repository by one of SWE-smith's procedural Python
modifiers (the real `swesmith` package, its entity extraction and
`generate_patch_fast`, on the local tree; no clone, no GitHub). The same
seed gives the same bugs. Each bug is a unified diff, BUGS/ID/bug.diff,
with a task id in SWE-smith's form, `owner__repo.PIN8.MODIFIER__HASH`;
OUT lists them (id, file, entity) with the counts."""

import json
import os
import subprocess
import sys

from common import venv, write_json

INSIDE = r"""
import json, os, random, sys
from swesmith.bug_gen.adapters.python import get_entities_from_file_py
from swesmith.bug_gen.procedural.python import MODIFIERS_PYTHON
from swesmith.bug_gen.utils import generate_patch_fast
tree, source, modifier, seed, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
entities = []
root = os.path.join(tree, source)
files = [root] if root.endswith(".py") else [
    os.path.join(d, f) for d, _, names in sorted(os.walk(root)) for f in sorted(names)
    if f.endswith(".py") and "tests" not in os.path.relpath(d, tree).split(os.sep) and not f.startswith("test")]
for path in files:
    get_entities_from_file_py(entities, path)
prototype = next(m for m in MODIFIERS_PYTHON if m.name == modifier)
modify = type(prototype)(likelihood=prototype.likelihood, seed=seed)
candidates = [e for e in entities if modify.can_change(e)]
random.Random(seed).shuffle(candidates)
bugs = []
for candidate in candidates:
    bug = modify.modify(candidate)
    patch = generate_patch_fast(candidate, bug, tree) if bug else None
    if patch:
        bugs.append({"hash": bug.get_hash(), "file": os.path.relpath(candidate.file_path, tree),
                     "entity": candidate.name, "patch": patch})
    if len(bugs) >= limit:
        break
print(json.dumps({"entities": len(entities), "candidates": len(candidates), "bugs": bugs}))
"""


def main(key, owner, project, pin, source, modifier, tree, wheels, requirements, seed, limit, out, bugs):
    python = venv("generate", requirements, wheels)
    done = subprocess.run([python, "-c", INSIDE, os.path.abspath(tree), source, modifier, seed, limit],
                          check=True, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    found = json.loads(done.stdout)
    os.makedirs(bugs, exist_ok=True)
    for bug in found["bugs"]:
        bug["id"] = f"{owner}__{project}.{pin[:8]}.{modifier}__{bug['hash']}"
        bug["repo"] = key
        bug["modifier"] = modifier
        os.makedirs(os.path.join(bugs, bug["id"]), exist_ok=True)
        with open(os.path.join(bugs, bug["id"], "bug.diff"), "w") as f:
            f.write(bug.pop("patch"))
    write_json(out, found)
    print(f"{key} {modifier}: {found['entities']} entities, {found['candidates']} candidates, {len(found['bugs'])} bugs")


if __name__ == "__main__":
    main(*sys.argv[1:])
