#!/usr/bin/env python3
"""accepted.py RESULTS OUT: the items a per-item stage accepted (`ok`), in
key order."""

import sys

from common import read_jsonl, write_jsonl

if __name__ == "__main__":
    results, out = sys.argv[1:]
    write_jsonl(out, [line["item"] for line in read_jsonl(results) if line["class"] == "ok"])
