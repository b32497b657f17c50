"""What the canary's scripts share (apart from the pipeline's common.py,
so that editing them re-validates no task): the declared models, their
checkpoints' digests, the evaluation profiles' context lengths, and the
name of the server a trial needs."""

import hashlib
import os
import re
import sys

from common import sha256_file


def checkpoint_digests(path):
    """The digests a checkpoint is declared by: its weight files (as the
    SHA-256 of their SHA256SUMS listing, in name order), its tokenizer and
    its chat template."""
    weights = sorted(n for n in os.listdir(path) if n.endswith((".safetensors", ".bin", ".pt")))
    listing = "".join(f"{sha256_file(os.path.join(path, n))}  {n}\n" for n in weights)
    return {"weights_sha256": hashlib.sha256(listing.encode()).hexdigest() if weights else None,
            "tokenizer_sha256": sha256_file(os.path.join(path, "tokenizer.json")),
            "chat_template_sha256": sha256_file(os.path.join(path, "chat_template.jinja"))}


def profile_context(profile):
    """The context length an evaluation profile is named for: `official-32k`
    is 32,768 tokens."""
    name = os.path.splitext(os.path.basename(profile))[0]
    found = re.fullmatch(r"[a-z0-9-]+-(\d+)k", name)
    if not found:
        sys.exit(f"evaluation profile `{profile}`: its name must end in its context size, e.g. `official-32k`")
    return name, int(found.group(1)) * 1024


def declared_models(path):
    import tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)["models"]


def server_name(model, profile):
    """The model server a trial needs: its model at its profile's context
    (`model-a.official-32k`; a profile's name holds no `.`). One server
    serves one model at one context, so a profile of another context needs
    a server of its own."""
    return f"{model}.{profile}"


def server_parts(server):
    """`model-a.official-32k` → (`model-a`, `official-32k`, 32768)."""
    model, dot, profile = server.rpartition(".")
    if not dot or not model:
        sys.exit(f"model server `{server}`: expected MODEL.PROFILE, e.g. `model-a.official-32k`")
    name, context = profile_context(profile)
    return model, name, context
