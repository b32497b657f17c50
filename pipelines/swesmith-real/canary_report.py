#!/usr/bin/env python3
"""canary_report.py RESULTS SUMMARY MODELS PROFILES AGENT_REQUIREMENTS RECEIPT TRIALS LABEL OUT_MD OUT_JSON:
the canary's report by the team's reporting rule, stating only what
happened. Every figure comes from a record of the run: the canary's merged
RESULTS (per sample: its class, its attempts on record, its result with
what cairn read of its trajectory), cairn's SUMMARY of it, the declared and
checked models (MODELS), the evaluation profiles (PROFILES/NAME.yaml, by
digest: each profile's samples are reported apart, never pooled or
compared), the
pinned harness (AGENT_REQUIREMENTS), the registered freeze (RECEIPT) and
the trials. A figure whose source is missing is printed as `—`, never
guessed; a pass@k over fewer than k counted samples is N/A. LABEL is what
the manifest declares the result to be: `reproduction`, `approximation`
or `internal-experiment`."""

import hashlib
import json
import os
import re
import sys

from canary_common import declared_models, profile_context
from common import read_json, read_jsonl, sha256_file, write_json

LABELS = ("reproduction", "approximation", "internal-experiment")
MISSING = "—"


def harness_pin(requirements):
    for line in open(requirements):
        found = re.match(r"mini-swe-agent==(\S+) --hash=sha256:([0-9a-f]{64})", line)
        if found:
            return found.group(1), found.group(2)
    return None, None


def profile_settings(profile):
    """The sampling settings the profile gives the model (read as YAML by
    the harness; here only the flat `model_kwargs` numbers are needed)."""
    settings = {}
    in_kwargs = False
    for line in open(profile):
        if re.match(r"^  model_kwargs:", line):
            in_kwargs = True
            continue
        if in_kwargs:
            found = re.match(r"^    (\w+): ([\w.]+)", line)
            if not found:
                if line.strip() and not line.startswith("    "):
                    in_kwargs = False
                continue
            settings[found.group(1)] = found.group(2)
    return settings


def ran_at_once(spans):
    """The largest number of (start, end) spans that overlap."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def figure(value, digits=3):
    return MISSING if value is None else f"{value:.{digits}f}"


def model_rows(rows, k, mark):
    """Per model and sub-list: what its samples did."""
    stats = {}
    for row in rows:
        item = row["item"]
        s = stats.setdefault(item["model"], {}).setdefault(item["list"], {
            "tasks": 0, "requested": 0, "valid": 0, "error": 0, "infra": 0, "passed": 0, "marked": 0,
            "attempts": 0, "infra_attempts": 0, "pass@1": [], f"pass@{k}": [], "undefined": 0,
            "completion_tokens": 0, "prompt_tokens": 0, "step_limits": set(), "harness": set(),
            "wall_time_limits": set(), "command_timeouts": set(),
            "exit_status": {}, "spans": []})
        s["tasks"] += 1
        for key in ("requested", "valid", "error", "infra", "passed"):
            s[key] += row[key]
        s["marked"] += row.get("marked", 0)
        for at in (1, k):
            if row[f"pass@{at}"] is None:
                s["undefined"] += at == k
            else:
                s[f"pass@{at}"].append(row[f"pass@{at}"])
        for sample in row["samples"]:
            s["attempts"] += sample["attempts"]
            # Every attempt but a sample's last that ended with a class of
            # its own was infrastructure (only infra is retried).
            s["infra_attempts"] += sample["attempts"] - (0 if sample["class"] == "infra" else 1) if sample["attempts"] else 0
            result = sample.get("result") or {}
            trajectory = result.get("trajectory") or {}
            s["completion_tokens"] += trajectory.get("completion_tokens") or 0
            s["prompt_tokens"] += trajectory.get("prompt_tokens") or 0
            if trajectory.get("step_limit") is not None:
                s["step_limits"].add(trajectory["step_limit"])
            if trajectory.get("wall_time_limit_seconds") is not None:
                s["wall_time_limits"].add(trajectory["wall_time_limit_seconds"])
            if trajectory.get("command_timeout_seconds") is not None:
                s["command_timeouts"].add(trajectory["command_timeout_seconds"])
            if trajectory.get("harness_version"):
                s["harness"].add(trajectory["harness_version"])
            if trajectory.get("exit_status"):
                s["exit_status"][trajectory["exit_status"]] = s["exit_status"].get(trajectory["exit_status"], 0) + 1
            if "started_at" in result and "ended_at" in result:
                s["spans"].append((result["started_at"], result["ended_at"]))
    incompatible = {model for model, lists in stats.items() if any(s["marked"] for s in lists.values())}
    return stats, incompatible


def profile_section(name, path, rows, section, k, mark):
    """One evaluation profile's facts and its part of the report: what its
    samples did, per model and sub-list, and its comparisons; nothing in it
    pools or compares another profile's samples."""
    _, context = profile_context(path)
    sampling = profile_settings(path)
    stats, incompatible = model_rows(rows, k, mark)
    spans = [span for lists in stats.values() for s in lists.values() for span in s["spans"]]
    step_limits = sorted({x for lists in stats.values() for s in lists.values() for x in s["step_limits"]})
    applied = lambda key: sorted({x for lists in stats.values() for s in lists.values() for x in s[key]}) or None
    wall_times, command_timeouts = applied("wall_time_limits"), applied("command_timeouts")
    attempts = [sample["attempts"] for row in rows for sample in row["samples"] if sample["attempts"]]
    seeds = sorted({sample["seed"] for row in rows for sample in row["samples"] if sample["seed"] is not None})
    facts = {
        "profile": {"name": name, "sha256": sha256_file(path), "context": context,
                    "max_tokens": sampling.get("max_tokens"), "step_limit_applied": step_limits or None},
        "sampling": {"temperature": sampling.get("temperature"), "top_p": sampling.get("top_p"), "k": k,
                     "seeds": seeds},
        "timeouts": {"wall_time_limit_seconds_applied": wall_times,
                     "command_timeout_seconds_applied": command_timeouts},
        "concurrency": {"most_samples_at_once": ran_at_once(spans) if spans else None},
        "retries": {"verdict_retries": 0, "most_attempts_of_a_sample": max(attempts) if attempts else None,
                    "samples_retried": sum(1 for a in attempts if a > 1)},
        "models": {},
    }
    lines = ["", f"## Profile {name}", "",
             "Its figures are its own: no figure here pools, or compares, another profile's samples.", "",
             "| | |", "|---|---|",
             f"| profile | {name}, sha256 `{facts['profile']['sha256']}` |",
             f"| context / max tokens / steps | {context} / {sampling.get('max_tokens', MISSING)} / "
             f"{', '.join(map(str, step_limits)) or MISSING} (the step limit as the harness applied it) |",
             f"| sampling | temperature {sampling.get('temperature', MISSING)}, top_p {sampling.get('top_p', MISSING)}; "
             f"k = {k}; seeds {', '.join(map(str, seeds)) or MISSING} |",
             f"| timeouts | {', '.join(f'{t:g}' for t in wall_times or []) or MISSING} s per sample, "
             f"{', '.join(f'{t:g}' for t in command_timeouts or []) or MISSING} s per command (as the harness "
             "applied them) |",
             f"| concurrency | at most {facts['concurrency']['most_samples_at_once'] or MISSING} samples at once "
             "(from when each sample ran) |",
             f"| retries | verdicts: 0 (a sample with a verdict is never drawn again); infrastructure: "
             f"{facts['retries']['samples_retried']} samples retried, at most "
             f"{facts['retries']['most_attempts_of_a_sample'] or MISSING} attempts of one |",
             "", f"pass@1 and pass@{k} by the unbiased estimator, per model and sub-list; a sample in `error` (an "
             "empty trajectory, a harness that stopped) counts as a fail and is never dropped. N/A: some task has "
             f"fewer than {k} counted samples. Infrastructure attempts are retried inside their sample, never a "
             "verdict; each is in the ledger (`cairn show canary --items`).", "",
             f"| model | list | tasks | requested | valid | errors | infra attempts | passed | pass@1 | pass@{k} | "
             "completion tokens | how the agent ended |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for model in sorted(stats):
        facts["models"][model] = {"harness_incompatible": model in incompatible, "lists": {}}
        for list_name in sorted(stats[model]):
            s = stats[model][list_name]
            endings = ", ".join(f"{status} {n}" for status, n in sorted(s["exit_status"].items())) or MISSING
            if model in incompatible:
                row = {"tasks": s["tasks"], "requested": s["requested"], "pass@1": None, f"pass@{k}": None}
                lines.append(f"| {model} | {list_name} | {s['tasks']} | {s['requested']} | — | {s['error']} | "
                             f"{s['infra_attempts']} | — | harness-incompatible | harness-incompatible | "
                             f"{s['completion_tokens']} | {endings} |")
            else:
                defined = s["undefined"] == 0 and s["tasks"] > 0
                pass1 = sum(s["pass@1"]) / s["tasks"] if len(s["pass@1"]) == s["tasks"] else None
                passk = sum(s[f"pass@{k}"]) / s["tasks"] if defined else None
                row = {"tasks": s["tasks"], "requested": s["requested"], "valid": s["valid"], "error": s["error"],
                       "passed": s["passed"], "pass@1": pass1, f"pass@{k}": passk}
                lines.append(f"| {model} | {list_name} | {s['tasks']} | {s['requested']} | {s['valid']} | "
                             f"{s['error']} | {s['infra_attempts']} | {s['passed']} | "
                             f"{figure(pass1) if pass1 is not None else 'N/A'} | "
                             f"{figure(passk) if passk is not None else 'N/A'} | {s['completion_tokens']} | {endings} |")
            row.update(infra_attempts=s["infra_attempts"], completion_tokens=s["completion_tokens"],
                       prompt_tokens=s["prompt_tokens"], endings=s["exit_status"])
            facts["models"][model]["lists"][list_name] = row
    if incompatible:
        lines += ["", "Harness-incompatible under this profile (its smoke task never completed: no pass@k, no "
                  "comparison): " + ", ".join(sorted(incompatible)) + "."]
    compared = [p for p in section.get("comparisons", [])
                if "difference" in p and p["a"] not in incompatible and p["b"] not in incompatible]
    facts["comparisons"] = compared
    for pair in compared:
        low, high = pair["interval95"]
        lines += ["", f"{pair['a']} − {pair['b']}: {pair['difference']:+.3f} pass rate over "
                  f"{pair['paired_items']} paired tasks (95 % paired bootstrap {low:+.3f} to {high:+.3f})."]
    return facts, lines


def canary_report(results, summary_path, models_path, profiles_dir, agent_requirements, receipt, trials_path,
                  label, out_md, out_json):
    if label not in LABELS:
        sys.exit(f"the canary's label is `{label}`: declare one of {', '.join(LABELS)} (`canary_label`)")
    rows = read_jsonl(results)
    summary = read_json(summary_path)
    k = summary["samples"]["k"]
    if summary.get("protocol_by") != "profile":
        sys.exit(f"{summary_path} is not made per evaluation profile (`samples.protocol = \"profile\"`): "
                 "the report never pools two profiles' figures")
    models = declared_models(models_path)
    registered = read_json(receipt)
    manifest = read_json(os.path.join(registered["registry"], registered["name"], registered["version"],
                                      "manifest.json"))
    trials = read_jsonl(trials_path)
    version, wheel = harness_pin(agent_requirements)
    harness_seen = sorted({((sample.get("result") or {}).get("trajectory") or {}).get("harness_version")
                           for row in rows for sample in row["samples"]} - {None})
    lists = {}
    for t in trials:
        lists.setdefault(t["list"], set()).add(t["task"])
    by_profile = {}
    for row in rows:
        by_profile.setdefault(row["item"]["profile"], []).append(row)

    facts = {
        "label": label,
        "dataset": {"name": manifest["name"], "version": manifest["version"],
                    "semantic_digest": manifest["semantic_digest"],
                    "lists": {name: {"tasks": len(tasks), "split": "val" if name.startswith("validation") else "train"}
                              for name, tasks in sorted(lists.items())}},
        "harness": {"package": "mini-swe-agent", "pinned": version, "wheel_sha256": wheel,
                    "ran": harness_seen or None},
        "profiles": {},
    }
    lines = ["# Canary", "", f"**{label}**: " + {
        "reproduction": "a reproduction of a published protocol.",
        "approximation": "an approximation of a published protocol; the differences are the run's.",
        "internal-experiment": "an internal experiment; not comparable to published figures."}[label], "",
        "## What was run", "", "| | |", "|---|---|",
        f"| dataset | {manifest['name']} {manifest['version']}, semantic digest `{manifest['semantic_digest']}` |",
        "| lists | " + ", ".join(f"{name} ({len(tasks)} tasks, {facts['dataset']['lists'][name]['split']} split)"
                              for name, tasks in sorted(lists.items())) + ", pinned by SHA-256 in the manifest |",
        f"| harness | mini-swe-agent {version} (wheel sha256 `{wheel}`); the trajectories say "
        f"{', '.join(harness_seen) or MISSING} |",
        f"| profiles | {', '.join(sorted(by_profile)) or MISSING}, each reported apart, never pooled or compared |",
        "| runtime | each trial on this machine, in its task's checkout (no image) |",
        "", "| model | served as | revision | weights sha256 | tokenizer sha256 | chat template sha256 |",
        "|---|---|---|---|---|---|"]
    for name, m in sorted(models.items()):
        lines.append(f"| {name} | {m['served_name']} | {m['revision']} | `{m['weights_sha256'][:16]}…` | "
                     f"`{m['tokenizer_sha256'][:16]}…` | `{m['chat_template_sha256'][:16]}…` |")
    for name in sorted(by_profile):
        path = os.path.join(profiles_dir, f"{name}.yaml")
        facts["profiles"][name], section = profile_section(
            name, path, by_profile[name], summary["protocols"].get(name, {}), k, "harness-incompatible")
        lines += section
    with open(out_md, "w") as f:
        f.write("\n".join(lines) + "\n")
    write_json(out_json, facts)


if __name__ == "__main__":
    canary_report(*sys.argv[1:])
