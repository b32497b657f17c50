#!/usr/bin/env python3
"""wheels.py OUT REQUIREMENTS...: downloads exactly the pinned wheels of
each requirements file (every one checked against its SHA-256 by pip) into
OUT. Every later environment is made from OUT with no index: once this
stage has run, the pipeline needs no network to rebuild a venv."""

import os
import subprocess
import sys


def main(out, *requirements):
    os.makedirs(out, exist_ok=True)
    for path in requirements:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--only-binary", ":all:", "--require-hashes", "-r", path, "-d", out],
                       check=True, env={**os.environ, "PIP_FIND_LINKS": ""})
    print(f"{len(os.listdir(out))} wheels in {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
