#!/usr/bin/env python3
"""canary_report.py RESULTS PASSK MODELS AGENT RECEIPT TRIALS OUT: the
canary's report (Markdown, to OUT) by the team's reporting rule: what was
run (the dataset and its digest, the lists, the agent profile and its
digest, context, max tokens, steps, sampling, seeds, runtime images, each
checkpoint's digests), and what happened, from the records only: the most
samples that ran at once (from when each ran), the attempts of each sample
(retries), then pass@1 and pass@k per model and sub-list over the
requested and valid denominators, from the canary's RESULTS and its PASSK
summary, and the paired comparison of the models. A harness-incompatible
model has no pass@k and no comparison."""

import hashlib
import json
import sys

from common import agent_profile, declared_models, read_jsonl, registered


def file_sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def ran_at_once(spans):
    """The largest number of (start, end) spans that overlap."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def canary_report(results, summary_path, models_path, agent_path, receipt, trials_path, out):
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
            "marked": 0, "pass1": 0.0, "passk": 0.0, "mixed": 0, "undefined1": 0, "undefinedk": 0})
        s["tasks"] += 1
        s["requested"] += r["requested"]
        s["valid"] += r["valid"]
        s["error"] += r["error"]
        s["passed"] += r["passed"]
        # A pass@k over fewer than k counted samples is undefined: the
        # figure it would enter is N/A, never a fraction of a guess.
        s["pass1"] += r["pass@1"] or 0.0
        s["passk"] += r[f"pass@{k}"] or 0.0
        s["undefined1"] += r["pass@1"] is None
        s["undefinedk"] += r[f"pass@{k}"] is None
        s["mixed"] += r["group"] == "mixed"
        for sample in r["samples"]:
            if sample["class"] not in ("ok", "failed", "error"):
                s["marked"] += 1
    samples = [sample for r in rows for sample in r["samples"]]
    attempts = [sample["attempts"] for sample in samples if sample.get("attempts")]
    spans = [(sample["result"]["started_at"], sample["result"]["ended_at"]) for sample in samples
             if "started_at" in (sample.get("result") or {})]
    incompatible = {model for model, lists in stats.items() if any(s["marked"] for s in lists.values())}
    images = sorted({t["reference"] for t in trials if t.get("reference")})
    lines = ["# Canary", "",
             "## What was run", "",
             "| | |", "|---|---|",
             f"| dataset | {manifest['name']} {manifest['version']} (semantic digest `{manifest['semantic_digest']}`) |",
             f"| lists | {', '.join(sorted({t['list'] for t in trials}))} ({len({t['task'] for t in trials})} tasks) |",
             f"| evaluation profile | {agent['name']} (prompt {agent['prompt_profile']}), {agent_path} sha256 `{file_sha256(agent_path)}` |",
             f"| context / max tokens / steps | {agent['max_context']} / {agent['max_tokens']} / {agent['max_steps']} (the context checked against the model server before the first trial) |",
             f"| sampling | temperature {agent['temperature']}, top_p {agent['top_p']}; k = {k} samples per task, seed {summary['samples']['seed']} + sample index (a re-drawn sample's own seed is in the ledger) |",
             "| concurrency | one model at a time; " + (f"at most {ran_at_once(spans)} samples ran at once (from when each ran) |" if spans else
                 "how many samples ran at once is not in the results, which a re-run reproduces byte for byte (`cairn show canary` has each attempt's times) |"),
             f"| retries | verdicts: 0 (a sample with a verdict is never drawn again); infrastructure: {sum(a > 1 for a in attempts)} samples retried, at most {max(attempts) if attempts else '—'} attempts of one |",
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
            if model in incompatible:
                lines.append(f"| {model} | {name} | {tasks} | {s['requested']} | — | {s['error']} | {s['marked']} | "
                             f"— | harness-incompatible | harness-incompatible | — |")
                continue
            lines.append(f"| {model} | {name} | {tasks} | {s['requested']} | {s['valid']} | {s['error']} | {s['marked']} | "
                         f"{s['passed']} | {'N/A' if s['undefined1'] else format(s['pass1'] / tasks, '.3f')} | "
                         f"{'N/A' if s['undefinedk'] else format(s['passk'] / tasks, '.3f')} | {s['mixed']} |")
    for pair in summary.get("comparisons", []):
        if "difference" in pair and pair["a"] not in incompatible and pair["b"] not in incompatible:
            low, high = pair["interval95"]
            lines += ["", f"{pair['a']} − {pair['b']}: {pair['difference']:+.3f} pass rate over "
                      f"{pair['paired_items']} paired tasks (95 % paired bootstrap {low:+.3f} to {high:+.3f})."]
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    canary_report(*sys.argv[1:])
