"""What the stages of swesmith-curation share: stable hashes, JSON and
JSON Lines files, the registered freeze, the configs' agent profile,
models and context length, and a task's gold patch and test run."""

import hashlib
import json
import os
import subprocess
import sys


def h(*parts):
    """A stable integer from the parts (sha256)."""
    text = "\0".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big")


def frac(*parts):
    return h(*parts) / 2**64


def read_jsonl(path):
    with open(path) as f:
        text = f.read()
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def write_jsonl(path, records):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")


def write_json(path, value):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def registered(receipt_path):
    """The registered freeze a receipt names: its directory and manifest."""
    with open(receipt_path) as f:
        receipt = json.load(f)
    root = os.path.join(receipt["registry"], receipt["name"], receipt["version"])
    with open(os.path.join(root, "manifest.json")) as f:
        return root, json.load(f)


def agent_profile(path):
    """An agent profile's settings, its name (the file's, ending in its
    context size: `selection-32k`) checked against its `max_context`."""
    import re
    import tomllib
    with open(path, "rb") as f:
        agent = tomllib.load(f)["agent"]
    name = os.path.splitext(os.path.basename(path))[0]
    named = re.fullmatch(r"[a-z0-9-]+-(\d+)k", name)
    if not named:
        sys.exit(f"agent profile `{path}`: its name must end in its context size, e.g. `selection-32k`")
    if int(named.group(1)) * 1024 != agent["max_context"]:
        sys.exit(f"agent profile `{path}`: max_context is {agent['max_context']}, but its name says "
                 f"{int(named.group(1)) * 1024}")
    return {**agent, "name": name}


def declared_models(path):
    import tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)["models"]


def trainer_context(trainer):
    with open(trainer) as f:
        for line in f:
            if line.strip().startswith("max_seq_len:"):
                return int(line.split(":", 1)[1])
    return None


def git_apply(repo, patch, *flags):
    """`git apply` of `patch` to the tree `repo`, run there (no git
    repository is needed): exactly, with no fuzz; `--check` only tells
    whether it would. An empty patch applies, as with `patch`: a task whose
    bug is missing is the oracle's to find (NOP passes)."""
    return subprocess.run(["git", "apply", "--allow-empty", *flags, os.path.abspath(patch)], cwd=repo,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_tests(repo, test, budget=None):
    """Whether `test` passes in `repo`; None when it ran past `budget`
    seconds (and was killed)."""
    try:
        done = subprocess.run([sys.executable, "-B", test], cwd=repo, capture_output=True, text=True,
                              timeout=budget)
    except subprocess.TimeoutExpired:
        return None
    return done.returncode == 0
