"""What the stages of swesmith-real share: JSON files, the virtual
environments (made from the pinned wheels, offline), and pytest runs read
test by test from their JUnit XML."""

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

# Exit codes the manifest classes: an attempt that says nothing about the
# task (a timeout, a test run that could not start) is infrastructure.
INFRA = 75
UNGRADABLE = 2


def read_json(path):
    with open(path) as f:
        return json.load(f)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_json(path, value):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def write_jsonl(path, rows):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def environment_digest(requirements):
    """What a test run's results depend on besides the code: the pinned
    packages and the interpreter."""
    with open(requirements, "rb") as f:
        pins = f.read()
    return "sha256:" + hashlib.sha256(pins + sys.version.encode()).hexdigest()


def venv(name, requirements, wheels, root="state/swesmith-real/venvs", no_deps=False):
    """The Python of a virtual environment with exactly `requirements`,
    installed from the wheels in `wheels` (no index): made once, named by
    the requirements' digest, made again if it is incomplete. With
    `no_deps`, what the requirements list is all that is installed (their
    own declared dependencies are not resolved)."""
    digest = sha256_file(requirements)[:16]
    path = os.path.abspath(os.path.join(root, f"{name}-{digest}"))
    python = os.path.join(path, "bin", "python")
    done = os.path.join(path, ".complete")
    os.makedirs(root, exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(done):
            shutil.rmtree(path, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", path], check=True)
            subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index",
                            "--find-links", os.path.abspath(wheels), "--require-hashes",
                            "--only-binary", ":all:", *(["--no-deps"] if no_deps else []),
                            "-r", os.path.abspath(requirements)],
                           check=True, env={**os.environ, "PIP_FIND_LINKS": ""})
            open(done, "w").close()
    return python


def copy_tree(source, target):
    shutil.copytree(source, target, symlinks=True)


def run_tests(python, tree, repo, timeout, junit):
    """Runs the repository's tests in `tree`; (outcome of each test by id,
    pytest's exit code). Raises TimeoutError when the run outlives
    `timeout`."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
           "PYTHONPATH": os.path.join(tree, repo["pythonpath"])}
    # No tracebacks: hundreds of failing tests on a bugged tree would spend
    # longer formatting them than running; the JUnit XML is what is read.
    command = [python, "-m", "pytest", "-q", "--tb=no", "-p", "no:cacheprovider", "--rootdir", tree,
               "--junitxml", junit, "-o", "junit_family=xunit1", repo["tests"]]
    try:
        done = subprocess.run(command, cwd=tree, env=env, timeout=timeout,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except subprocess.TimeoutExpired as error:
        raise TimeoutError(f"the tests ran longer than {timeout} s") from error
    outcomes = {}
    if os.path.exists(junit):
        outcomes = read_junit(junit)
    return outcomes, done.returncode, done.stdout


def read_junit(path):
    """Each test case's outcome: passed, failed, error or skipped, by its
    id (`file::Class::name`, as pytest names it)."""
    root = ElementTree.parse(path).getroot()
    outcomes = {}
    for case in root.iter("testcase"):
        file = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        classname = case.get("classname", "")
        module = os.path.splitext(file)[0].replace("/", ".")
        inner = classname[len(module) + 1:] if classname.startswith(module + ".") else ""
        test_id = "::".join(x for x in (file, inner.replace(".", "::"), case.get("name")) if x)
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
        outcomes[test_id] = outcome
    return outcomes


def collection_failed(outcomes, code):
    """pytest could not collect the tests (exit 2, 3 or 4, or an error
    case with no test name: a module that does not import)."""
    return code in (2, 3, 4) or not outcomes


def temp_dir():
    return tempfile.TemporaryDirectory(prefix="swesmith-real-")

