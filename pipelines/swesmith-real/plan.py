#!/usr/bin/env python3
"""plan.py REPOS NAMES MODIFIERS OUT_REPOS OUT_GENERATION: the repositories
named in NAMES (comma-separated, in that order) from REPOS, and one
generation item per (repository, modifier). A repository's `stage` is left
out: it decides how its tasks are selected, not how they are fetched,
generated or graded (`tasks` reads it from REPOS)."""

import sys

from common import read_jsonl, write_jsonl


def main(repos_path, names, modifiers, out_repos, out_generation):
    repos = {r["key"]: r for r in read_jsonl(repos_path)}
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in repos]
    if unknown:
        sys.exit(f"not in {repos_path}: {', '.join(unknown)}")
    chosen = [{k: v for k, v in repos[n].items() if k != "stage"} for n in wanted]
    write_jsonl(out_repos, chosen)
    write_jsonl(out_generation, [
        {"key": f"{r['key']}:{m}", "repo": r["key"], "modifier": m,
         **{k: r[k] for k in ("owner", "project", "version", "sha256", "source", "tests", "pythonpath")}}
        for r in chosen for m in modifiers.split(",")])


if __name__ == "__main__":
    main(*sys.argv[1:])
