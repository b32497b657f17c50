#!/usr/bin/env python3
"""accepted.py RESULTS OUT [RECORDS]: the items a per-item stage accepted
(`ok`) in RESULTS, in its order; with RECORDS, the full records of those
items from RECORDS (by `id`), in RECORDS' order."""

import sys

from common import read_jsonl, write_jsonl


def accepted(results, out, records=None):
    ok = [r["item"] for r in read_jsonl(results) if r["class"] == "ok"]
    if records is not None:
        # The full records of the accepted items, in their list's order.
        ids = {item["id"] for item in ok}
        ok = [record for record in read_jsonl(records) if record["id"] in ids]
    write_jsonl(out, ok)


if __name__ == "__main__":
    accepted(*sys.argv[1:])
