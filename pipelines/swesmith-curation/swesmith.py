#!/usr/bin/env python3
"""The task-specific steps of the swesmith-curation pipeline.

Everything here is deterministic: the same arguments give the same bytes.
cairn does the rest (selection, splits, gates, freeze, export, register,
images) with its built-ins; see ../swesmith-curation.toml.

    pool OUT --size N --repos R --seed S --old-freeze K
                                             the candidate pool and its lists
    combine A B OUT                          stage A + stage B = the main list
    materialize-one DIR ID REPO TEMPLATE FUNC DEFECT IMAGE
                                             the task directory of one planned task
    static-check TASK RESULT                 static checks of one task
    accepted RESULTS OUT [RECORDS]           the `ok` items of a per-item stage (their
                                             records in RECORDS, by `id`)
    oracle TASK RESULT [--fault-rate F]      NOP must fail, gold must pass
    canary-lists RECEIPT SMOKE FULL VAL TRAIN MODELS [IMAGES]
                                             fixed canary lists from the registered freeze
    canary MODEL TASK_ID RECEIPT AGENT RESULT
                                             one sample of one model on one task, through
                                             the model server at $OPENAI_BASE_URL
    check-served MODELS AGENT TRAINER        the served models are the declared checkpoints
                                             (by digest) and the context length agrees
    digests CHECKPOINT_DIR                   the digests to declare a checkpoint by
    canary-report RESULTS PASSK ... OUT      pass@k per model and sub-list, with what the
                                             reporting rule asks for
    check-context AGENT SERVER TRAINER       the context length agrees everywhere
    train RECEIPT TRAINER OUT [--dry-run]    load every frozen task, resolve the config
"""

import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def h(*parts):
    """A stable integer from the parts (sha256)."""
    text = "\0".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big")


def frac(*parts):
    return h(*parts) / 2**64


def write_jsonl(path, records):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")


def read_jsonl(path):
    with open(path) as f:
        text = f.read()
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def write_json(path, value):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def templates():
    repos = os.path.join(HERE, "repos")
    out = {}
    for name in sorted(os.listdir(repos)):
        with open(os.path.join(repos, name, "mutations.json")) as f:
            out[name] = sorted(json.load(f))
    return out


# ---- pool ------------------------------------------------------------------

OWNERS = ["pallets", "psf", "pydata", "python", "encode", "tiangolo", "sympy", "astropy",
          "oauthlib", "marshmallow", "pygments", "sqlfluff", "cool-retro", "mwaskom",
          "pyca", "getmoto"]
MUTATIONS = ["lm_rewrite", "combine_file", "func_pm_op_change", "func_basic",
             "pr_2817", "func_pm_remove_assign"]
MODELS = ["gpt-4o", "claude-3.5", "claude-3.7"]


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
    import gzip
    import io
    import tarfile
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


# ---- plan and materialize --------------------------------------------------

def combine(args):
    a, b, out = args
    rows = [dict(r, stage="A") for r in read_jsonl(a)] + [dict(r, stage="B") for r in read_jsonl(b)]
    write_jsonl(out, rows)


def materialize_one(args):
    d, task_id, repo, template, func, defect, image = args
    task = {"id": task_id, "repo": repo, "template": template, "func": func,
            "defect": defect, "image": image}
    build_task(task, os.path.join(HERE, "repos", template), d)


def build_task(task, template, d):
    name, func = task["template"], task["func"]
    with open(os.path.join(template, "mutations.json")) as f:
        mutation = json.load(f)[func]
    with open(os.path.join(template, "pkg", f"{name}.py")) as f:
        fixed = f.read()
    broken = fixed if task["defect"] == "nop-passes" else \
        fixed.replace(mutation["original"], mutation["mutated"], 1)
    os.makedirs(os.path.join(d, "repo", "pkg"))
    os.makedirs(os.path.join(d, "repo", "tests"))
    with open(os.path.join(d, "repo", "pkg", f"{name}.py"), "w") as f:
        f.write(broken)
    open(os.path.join(d, "repo", "pkg", "__init__.py"), "w").close()
    shutil.copyfile(os.path.join(template, "tests", f"test_{func}.py"),
                    os.path.join(d, "repo", "tests", f"test_{func}.py"))
    # A gold patch that fails only touches a comment.
    target = broken + "\n# reviewed\n" if task["defect"] == "gold-fails" else fixed
    patch = "".join(difflib.unified_diff(
        broken.splitlines(True), target.splitlines(True),
        f"a/pkg/{name}.py", f"b/pkg/{name}.py"))
    if task["defect"] == "bad-patch":
        # A patch made against another revision: its context is wrong.
        patch = patch.replace("\n ", "\n #", 1)
    with open(os.path.join(d, "gold.patch"), "w") as f:
        f.write(patch)
    write_json(os.path.join(d, "task.json"), {
        "id": task["id"], "repo": task["repo"], "image": task["image"],
        "test": f"tests/test_{func}.py", "instance": f"Fix `{func}` in `pkg/{name}.py`.",
    })


# ---- per-task checks -------------------------------------------------------

def static_check(args):
    task_dir, result = args
    problems = []
    try:
        with open(os.path.join(task_dir, "task.json")) as f:
            meta = json.load(f)
        test = os.path.join(task_dir, "repo", meta["test"])
        with open(test) as f:
            compile(f.read(), test, "exec")
    except (OSError, ValueError, KeyError, SyntaxError) as e:
        problems.append(f"task metadata or test unreadable: {e}")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(task_dir, "repo"), os.path.join(tmp, "repo"))
        applied = subprocess.run(["patch", "-p1", "--fuzz=0", "--dry-run", "-s", "-d", os.path.join(tmp, "repo"),
                                  "-i", os.path.abspath(os.path.join(task_dir, "gold.patch"))],
                                 capture_output=True, text=True)
        if applied.returncode != 0:
            problems.append("gold patch does not apply: " + (applied.stdout + applied.stderr).strip()[:200])
    write_json(result, {"ok": not problems, "problems": problems})
    if problems:
        print("static-reject:", "; ".join(problems))
        sys.exit(1)


def accepted(args):
    results, out = args[0], args[1]
    ok = [r["item"] for r in read_jsonl(results) if r["class"] == "ok"]
    if len(args) > 2:
        # The full records of the accepted items, in their list's order.
        ids = {item["id"] for item in ok}
        ok = [record for record in read_jsonl(args[2]) if record["id"] in ids]
    write_jsonl(out, ok)


def run_tests(repo, test):
    done = subprocess.run([sys.executable, "-B", test], cwd=repo, capture_output=True, text=True)
    return done.returncode == 0


def oracle(args):
    task_dir, result = args[0], args[1]
    fault_rate = float(args[args.index("--fault-rate") + 1]) if "--fault-rate" in args else 0.0
    task_id = os.path.basename(os.path.normpath(task_dir))
    attempt = int(os.environ.get("CAIRN_ATTEMPT", "1"))
    if fault_rate > 0 and frac(task_id, "fault") < fault_rate and attempt == 1:
        print("PodReadyTimeout: pod did not become ready in 300s", file=sys.stderr)
        sys.exit(75)
    with open(os.path.join(task_dir, "task.json")) as f:
        meta = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "repo")
        shutil.copytree(os.path.join(task_dir, "repo"), repo)
        nop_passes = run_tests(repo, meta["test"])
        subprocess.run(["patch", "-p1", "--fuzz=0", "-s", "-d", repo, "-i",
                        os.path.abspath(os.path.join(task_dir, "gold.patch"))], check=True)
        gold_passes = run_tests(repo, meta["test"])
    verdict = "nop-passes" if nop_passes else "accepted" if gold_passes else "gold-fails"
    write_json(result, {"verdict": verdict, "nop": "pass" if nop_passes else "fail",
                        "gold": "pass" if gold_passes else "fail"})
    print(verdict)
    sys.exit({"accepted": 0, "nop-passes": 3, "gold-fails": 4}[verdict])


# ---- canary ----------------------------------------------------------------

def registered(receipt_path):
    with open(receipt_path) as f:
        receipt = json.load(f)
    root = os.path.join(receipt["registry"], receipt["name"], receipt["version"])
    with open(os.path.join(root, "manifest.json")) as f:
        return root, json.load(f)


def canary_lists(args):
    receipt, trials, n_val, n_train = args[0], args[1], int(args[2]), int(args[3])
    models = args[4].split(",")
    # Each trial runs in its task's mirrored image when the mirror went to
    # a registry (`reference`: pulled by digest); a layout has none.
    images = {r["id"]: r["reference"] for r in read_jsonl(args[5]) if r.get("reference")} if len(args) > 5 else {}
    _, manifest = registered(receipt)
    by_hash = lambda ids: sorted(ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())
    val_split = "val" if "val" in manifest["splits"] else sorted(manifest["splits"])[0]
    val = by_hash(manifest["splits"].get(val_split, []))[:n_val]
    train = by_hash(manifest["splits"].get("train", []))[:n_train]
    lists = [(f"validation{len(val)}", val), (f"train{len(train)}", train)]
    # Each model's first task is its smoke task: run first, and a harness
    # that cannot complete it marks the model, not the canary.
    first = (lists[0][1][:1] or lists[1][1][:1])
    def trial(model, task, name):
        item = {"key": f"{model}:{task}", "model": model, "task": task, "list": name,
                "smoke": task in first}
        if task in images:
            item["reference"] = images[task]
        return item

    write_jsonl(trials, [trial(m, t, name) for m in models for name, tasks in lists for t in tasks])


def post_json(url, body, timeout=60):
    """(status, decoded body) of a JSON POST; raises OSError when no answer."""
    import urllib.error
    import urllib.request
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        try:
            return error.code, json.loads(error.read())
        except ValueError:
            return error.code, {}


def get_json(url, timeout=30):
    import urllib.request
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return json.loads(answer.read())


def agent_profile(path):
    import tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)["agent"]


def canary(args):
    """One sample of one model on one task, through the model server at
    $OPENAI_BASE_URL (a cairn service): the agent asks, the model answers
    with an action, the action is applied and the task's tests decide."""
    model_name, task_id, receipt, agent_path, result = args
    base = os.environ.get("OPENAI_BASE_URL")
    if not base:
        sys.exit("no model server: OPENAI_BASE_URL is not set (the stage uses `services = [\"model-server\"]`)")
    agent = agent_profile(agent_path)
    root, _ = registered(receipt)
    task_dir = os.path.join(root, "items", task_id)
    with open(os.path.join(task_dir, "task.json")) as f:
        meta = json.load(f)
    attempt = int(os.environ.get("CAIRN_ATTEMPT", "1"))
    seed = int(os.environ.get("CAIRN_SEED", "0"))
    messages = [
        {"role": "system", "content": f"You are a software engineering agent ({agent['prompt_profile']})."},
        {"role": "user", "content": f"Task: {task_id}\nThe test {meta['test']} fails. Fix the repository."},
    ]
    request = {"model": model_name, "messages": messages, "seed": seed,
               "temperature": agent["temperature"], "top_p": agent["top_p"],
               "max_tokens": agent["max_tokens"]}
    try:
        status, answer = post_json(base.rstrip("/") + "/chat/completions", request)
    except OSError as error:
        # No answer at all: the server, not the model.
        print(f"model server: {error}", file=sys.stderr)
        sys.exit(75)
    if status >= 500:
        print(f"model server answered {status}: {answer.get('error', {}).get('message', '')}", file=sys.stderr)
        sys.exit(75)
    if status != 200:
        sys.exit(f"model server refused the request ({status}): {answer.get('error', {}).get('message', '')}")
    if answer.get("model") != model_name:
        sys.exit(f"asked {model_name}, answered by {answer.get('model')}: the server serves another model")
    content = answer["choices"][0]["message"]["content"] or ""
    trajectory = [] if not content.strip() else [
        {"role": "assistant", "content": content},
        {"role": "tool", "content": "applied"},
    ]
    action = re.search(r"ACTION: (\S+)", content)
    action = action.group(1) if action else None
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "repo")
        shutil.copytree(os.path.join(task_dir, "repo"), repo)
        if action == "edit-implementation":
            subprocess.run(["patch", "-p1", "--fuzz=0", "-s", "-d", repo, "-i",
                            os.path.abspath(os.path.join(task_dir, "gold.patch"))], check=False)
        passed = bool(trajectory) and run_tests(repo, meta["test"])
    write_json(result, {"model": model_name, "task": task_id, "turns": len([t for t in trajectory if t["role"] == "assistant"]),
                        "reward": 1 if passed else 0, "action": action, "attempt": attempt, "seed": seed,
                        "usage": answer.get("usage", {})})
    print(f"{model_name} {task_id} seed {seed}: reward {1 if passed else 0}, action {action}")


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


def digests(args):
    print(json.dumps(checkpoint_digests(args[0]), indent=2))


def declared_models(path):
    import tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)["models"]


def check_served(args):
    """Before any canary trial: every declared model is served under its
    name from its checkpoint, whose weights, tokenizer and chat template
    have the declared digests, and the served context length agrees with
    the agent profile and the trainer."""
    models_path, agent_path, trainer_path = args
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


def file_sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def canary_report(args):
    results, summary_path, models_path, agent_path, receipt, trials_path, jobs, retries, out = args
    rows = read_jsonl(results)
    with open(summary_path) as f:
        summary = json.load(f)
    k = summary["samples"]["k"]
    models = declared_models(models_path)
    agent = agent_profile(agent_path)
    _, manifest = registered(receipt)
    trials = read_jsonl(trials_path)
    stats = {}
    for r in rows:
        item = r["item"]
        s = stats.setdefault(item["model"], {}).setdefault(item["list"], {
            "tasks": 0, "requested": 0, "valid": 0, "error": 0, "passed": 0,
            "marked": 0, "pass1": 0.0, "passk": 0.0, "mixed": 0})
        s["tasks"] += 1
        s["requested"] += r["requested"]
        s["valid"] += r["valid"]
        s["error"] += r["error"]
        s["passed"] += r["passed"]
        s["pass1"] += r["pass@1"] or 0.0
        s["passk"] += r[f"pass@{k}"] or 0.0
        s["mixed"] += r["group"] == "mixed"
        for sample in r["samples"]:
            if sample["class"] not in ("ok", "failed", "error"):
                s["marked"] += 1
    images = sorted({t["reference"] for t in trials if t.get("reference")})
    lines = ["# Canary", "",
             "## What was run", "",
             "| | |", "|---|---|",
             f"| dataset | {manifest['name']} {manifest['version']} (semantic digest `{manifest['semantic_digest']}`) |",
             f"| lists | {', '.join(sorted({t['list'] for t in trials}))} ({len({t['task'] for t in trials})} tasks) |",
             f"| agent profile | {agent['prompt_profile']}, configs/agent.toml sha256 `{file_sha256(agent_path)}` |",
             f"| context / max tokens / steps | {agent['max_context']} / {agent['max_tokens']} / {agent['max_steps']} (checked against the server and the trainer before the first trial) |",
             f"| sampling | temperature {agent['temperature']}, top_p {agent['top_p']}; k = {k} samples per task, seed {summary['samples']['seed']} + sample index (a re-drawn sample's own seed is in the ledger) |",
             f"| concurrency | one model at a time, at most {jobs} trials of it at once, inside the cluster window |",
             f"| retries | {retries} per sample, on infrastructure failures only |",
             f"| runtime images | {len(images)} task images by digest" + (f", list sha256 `{hashlib.sha256(chr(10).join(images).encode()).hexdigest()}`" if images else " (none: the trials ran on this machine)") + " |",
             f"| kind | internal experiment on fixture models |" if all("fixture" in m.get("revision", "") for m in models.values()) else "| kind | evaluation |",
             "", "| model | served as | revision | weights sha256 | tokenizer sha256 | chat template sha256 |",
             "|---|---|---|---|---|---|"]
    for name, m in sorted(models.items()):
        lines.append(f"| {name} | {m['served_name']} | {m['revision']} | `{m['weights_sha256'][:16]}…` | "
                     f"`{m['tokenizer_sha256'][:16]}…` | `{m['chat_template_sha256'][:16]}…` |")
    lines += ["", "## Results", "",
             "pass@1 and pass@k by the unbiased estimator over the requested denominator: a trial in",
             "`error` (an empty trajectory) counts as a fail and is never dropped; the valid denominator is",
             "shown beside it. Infrastructure failures are retried inside their sample, never a verdict;",
             "every attempt is in the ledger (`cairn show canary/MODEL:TASK#SAMPLE`). A model whose smoke",
             "task never completes is marked harness-incompatible and not run further.", "",
             f"| model | list | tasks | samples requested | valid | errors | marked | passed | pass@1 | pass@{k} | mixed groups |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model in sorted(stats):
        for name in sorted(stats[model]):
            s = stats[model][name]
            tasks = s["tasks"]
            lines.append(f"| {model} | {name} | {tasks} | {s['requested']} | {s['valid']} | {s['error']} | {s['marked']} | "
                         f"{s['passed']} | {s['pass1'] / tasks:.3f} | {s['passk'] / tasks:.3f} | {s['mixed']} |")
    for pair in summary.get("comparisons", []):
        if "difference" in pair:
            low, high = pair["interval95"]
            lines += ["", f"{pair['a']} − {pair['b']}: {pair['difference']:+.3f} pass rate over "
                      f"{pair['paired_items']} paired tasks (95 % paired bootstrap {low:+.3f} to {high:+.3f})."]
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


# ---- train -----------------------------------------------------------------

def trainer_context(trainer):
    with open(trainer) as f:
        for line in f:
            if line.strip().startswith("max_seq_len:"):
                return int(line.split(":", 1)[1])
    return None


def context_lengths(agent, server, trainer):
    with open(server) as f:
        s = json.load(f)["max_model_len"]
    return {"agent": agent_profile(agent)["max_context"], "server": s, "trainer": trainer_context(trainer)}


def check_context(args):
    lengths = context_lengths(*args)
    if len(set(lengths.values())) != 1:
        print("context length disagrees: " + ", ".join(f"{k} {v}" for k, v in lengths.items()))
        sys.exit(1)
    print(f"context length {lengths['agent']} everywhere")


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


COMMANDS = {
    "pool": pool, "combine": combine, "materialize-one": materialize_one, "static-check": static_check,
    "accepted": accepted, "oracle": oracle, "canary-lists": canary_lists, "canary": canary,
    "canary-report": canary_report, "check-context": check_context, "train": train,
    "check-served": check_served, "digests": digests,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    COMMANDS[sys.argv[1]](sys.argv[2:])
