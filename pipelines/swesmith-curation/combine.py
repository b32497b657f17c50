#!/usr/bin/env python3
"""combine.py A B RESERVES_A RESERVES_B OUT_MAIN OUT_PLANNED: the main list,
stage A's tasks then stage B's, and the planned list, the main list then
stage A's reserves then stage B's (each stage's own in order: what replaces
a rejected task of that stage); every record marked with its stage
(`"stage": "A"` or `"B"`)."""

import sys

from common import read_jsonl, write_jsonl


def marked(path, stage):
    return [dict(r, stage=stage) for r in read_jsonl(path)]


def combine(a, b, reserves_a, reserves_b, out_main, out_planned):
    main = marked(a, "A") + marked(b, "B")
    write_jsonl(out_main, main)
    write_jsonl(out_planned, main + marked(reserves_a, "A") + marked(reserves_b, "B"))


if __name__ == "__main__":
    combine(*sys.argv[1:])
