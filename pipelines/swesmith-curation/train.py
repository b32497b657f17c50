#!/usr/bin/env python3
"""train.py RECEIPT TRAINER OUT [--dry-run]: the fixture trainer: loads
every task of the registered freeze RECEIPT names (each file checked
against its SHA256SUMS), then writes the resolved config to OUT: the
dataset (name, version, semantic digest, counts, the train split), the
trainer's settings from TRAINER, and the mode (`dry-run` with
--dry-run)."""

import hashlib
import os
import sys

from common import registered, write_json


def train(args):
    receipt, trainer, out = args[0], args[1], args[2]
    root, manifest = registered(receipt)
    sums = {}
    with open(os.path.join(root, "SHA256SUMS")) as f:
        for line in f:
            digest, path = line.rstrip("\n").split("  ", 1)
            sums[path] = digest
    loaded = 0
    for split, ids in manifest["splits"].items():
        for task in ids:
            for path, digest in sums.items():
                if path.startswith(f"items/{task}/"):
                    with open(os.path.join(root, path), "rb") as f:
                        if hashlib.sha256(f.read()).hexdigest() != digest:
                            sys.exit(f"{path}: does not match the freeze")
            loaded += 1
    config = {"dataset": {"name": manifest["name"], "version": manifest["version"],
                          "semantic_digest": manifest["semantic_digest"], "counts": manifest["counts"],
                          "train_split": "train"},
              "trainer": {}, "mode": "dry-run" if "--dry-run" in args else "train"}
    with open(trainer) as f:
        for line in f:
            if ":" in line and not line.strip().startswith("#"):
                k, v = line.split(":", 1)
                config["trainer"][k.strip()] = v.strip()
    write_json(out, config)
    print(f"loaded {loaded} frozen tasks; resolved config written ({config['mode']})")


if __name__ == "__main__":
    train(sys.argv[1:])
