#!/usr/bin/env python3
"""digests.py CHECKPOINT_DIR: prints the digests to declare a checkpoint by
in configs/models.toml: its weight files (as the SHA-256 of their
SHA256SUMS listing, in name order), its tokenizer and its chat
template."""

import hashlib
import json
import os
import sys


def checkpoint_digests(path):
    """The digests a checkpoint is declared by: its weight files (as the
    SHA-256 of their SHA256SUMS listing, in name order), its tokenizer and
    its chat template."""
    def sha(p):
        with open(p, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    weights = sorted(n for n in os.listdir(path) if n.endswith((".safetensors", ".bin", ".pt")))
    listing = "".join(f"{sha(os.path.join(path, n))}  {n}\n" for n in weights)
    template = os.path.join(path, "chat_template.jinja")
    if os.path.exists(template):
        chat_template = sha(template)
    else:
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            chat_template = hashlib.sha256(json.load(f)["chat_template"].encode()).hexdigest()
    return {"weights_sha256": hashlib.sha256(listing.encode()).hexdigest() if weights else None,
            "tokenizer_sha256": sha(os.path.join(path, "tokenizer.json")),
            "chat_template_sha256": chat_template}


if __name__ == "__main__":
    checkpoint, = sys.argv[1:]
    print(json.dumps(checkpoint_digests(checkpoint), indent=2))
