#!/usr/bin/env python3
"""pool.py OUT --size N --repos R --seed S --old-freeze K: the candidate
pool, deterministic from the seed: N candidates over R repositories, each
built on one of the task repositories in repos/ (with the evidence fields
the plan selects on: tier, succeeding models, SWE-Master result, image
status), the third-party filtered and filter-pro subsets, an older freeze
of K tasks inside filter-pro, and an OCI image layout with one tiny base
image per repository. Writes OUT/candidates.jsonl, OUT/filtered.jsonl,
OUT/old-freeze.jsonl and OUT/images."""

import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

from common import frac, h, write_jsonl

HERE = os.path.dirname(os.path.abspath(__file__))

OWNERS = ["pallets", "psf", "pydata", "python", "encode", "tiangolo", "sympy", "astropy",
          "oauthlib", "marshmallow", "pygments", "sqlfluff", "cool-retro", "mwaskom",
          "pyca", "getmoto"]
MUTATIONS = ["lm_rewrite", "combine_file", "func_pm_op_change", "func_basic",
             "pr_2817", "func_pm_remove_assign"]
MODELS = ["gpt-4o", "claude-3.5", "claude-3.7"]


def templates():
    """Each task repository's functions that have a mutation, by name."""
    repos = os.path.join(HERE, "repos")
    out = {}
    for name in sorted(os.listdir(repos)):
        with open(os.path.join(repos, name, "mutations.json")) as f:
            out[name] = sorted(json.load(f))
    return out


def pool(args):
    out = args[0]
    size, n_repos = int(args[args.index("--size") + 1]), int(args[args.index("--repos") + 1])
    seed, n_old = args[args.index("--seed") + 1], int(args[args.index("--old-freeze") + 1])
    tpl = templates()
    names = sorted(tpl)
    repos = []
    for i in range(n_repos):
        owner = OWNERS[i % len(OWNERS)]
        repos.append(f"{owner}__{owner[:4]}{i:03d}")
    records = []
    for i in range(size):
        # Repos are skewed, as in the real pool: a few have thousands.
        r = repos[min(int(frac(seed, "repo", i) ** 2 * n_repos), n_repos - 1)]
        commit = f"{h(seed, r) % 16**8:08x}"
        task = f"{r}.{commit}.{MUTATIONS[h(seed, 'mut', i) % len(MUTATIONS)]}__{h(seed, 'id', i) % 16**8:08x}"
        template = names[h(seed, r, "tpl") % len(names)]
        func = tpl[template][h(seed, task, "func") % len(tpl[template])]
        x = frac(seed, task, "evidence")
        tier = 1 if x < 0.2 else 2 if x < 0.45 else 3 if x < 0.55 else 4
        models = [m for k, m in enumerate(MODELS) if frac(seed, task, "model", k) < (0.05, 0.15, 0.7)[k]]
        d = frac(seed, task, "defect")
        defect = "bad-patch" if d < 0.04 else "nop-passes" if d < 0.09 else "gold-fails" if d < 0.14 else "none"
        records.append({
            "id": task,
            "repo": r,
            "template": template,
            "func": func,
            "defect": defect,
            "tier": tier,
            "models": models,
            "master": ("reward-1" if tier == 3 else "partial" if tier == 4 else "none"),
            "image": f"swesmith/{r}:base",
            "image_status": "ok" if frac(seed, task, "img") < 0.97 else "missing",
            "in_filtered": False,
            "filter_pro": False,
            "old_freeze": False,
        })
    # The third-party filtered subset (3,748 at full size), the filter-pro
    # subset inside it (487), and an older freeze inside that (125).
    ranked = sorted(records, key=lambda r: h(seed, "filtered", r["id"]))
    n_filtered = max(1, size * 3748 // 59136)
    n_pro = max(1, size * 487 // 59136)
    for k, r in enumerate(ranked[:n_filtered]):
        r["in_filtered"] = True
        r["filter_pro"] = k < n_pro
    pro = [r for r in ranked[:n_pro] if r["image_status"] == "ok"]
    for r in sorted(pro, key=lambda r: h(seed, "old", r["id"]))[:n_old]:
        r["old_freeze"] = True
    write_jsonl(f"{out}/candidates.jsonl", records)
    write_jsonl(f"{out}/filtered.jsonl", [r["id"] for r in ranked[:n_filtered]])
    write_jsonl(f"{out}/old-freeze.jsonl", [r["id"] for r in records if r["old_freeze"]])
    write_oci_layout(f"{out}/images", sorted({r["image"] for r in records}))


def write_oci_layout(root, images):
    """An OCI image layout with one tiny image per name."""
    blobs = os.path.join(root, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)

    def blob(data):
        digest = hashlib.sha256(data).hexdigest()
        with open(os.path.join(blobs, digest), "wb") as f:
            f.write(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    manifests = []
    for name in images:
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
            data = f"{name}\n".encode()
            info = tarfile.TarInfo("etc/swesmith-image")
            info.size, info.mtime, info.mode = len(data), 946684800, 0o644
            tar.addfile(info, io.BytesIO(data))
        layer = blob(gzip.compress(raw.getvalue(), mtime=0))
        config = blob(json.dumps({
            "architecture": "amd64", "os": "linux",
            "config": {"Env": ["PATH=/usr/bin"], "Labels": {"swesmith.image": name}},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()]},
        }, sort_keys=True).encode())
        manifest = blob(json.dumps({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
        }, sort_keys=True).encode())
        manifests.append({
            "mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest,
            "annotations": {"org.opencontainers.image.ref.name": name},
        })
    with open(os.path.join(root, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion":"1.0.0"}')
    with open(os.path.join(root, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                   "manifests": manifests}, f, sort_keys=True)


if __name__ == "__main__":
    pool(sys.argv[1:])
