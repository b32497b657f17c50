#!/usr/bin/env python3
"""combine.py A B OUT: the main list, stage A's tasks then stage B's, each
record marked with its stage (`"stage": "A"` or `"B"`)."""

import sys

from common import read_jsonl, write_jsonl


def combine(a, b, out):
    rows = [dict(r, stage="A") for r in read_jsonl(a)] + [dict(r, stage="B") for r in read_jsonl(b)]
    write_jsonl(out, rows)


if __name__ == "__main__":
    combine(*sys.argv[1:])
