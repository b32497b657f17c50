#!/usr/bin/env python3
"""canary.py MODEL TASK TASK_DIR TREE TESTS PYTHONPATH PROFILE AGENT_WHEELS AGENT_REQUIREMENTS TEST_WHEELS TEST_REQUIREMENTS TRAJECTORY RESULT:
one sample of MODEL on TASK (its directory in the freeze, TASK_DIR), by a
real agent harness: mini-swe-agent (installed offline from AGENT_WHEELS,
exactly AGENT_REQUIREMENTS) runs with the evaluation profile PROFILE (its
config file) in a git checkout of the task's bugged repository (the clean
TREE with the task's bug applied), against the model server at
$OPENAI_BASE_URL, with the sample's seed ($CAIRN_SEED). Its trajectory is
written to TRAJECTORY, as mini-swe-agent writes it.

A submitted patch is graded as SWE-bench grades: applied to a fresh bugged
tree, the repository's tests (TESTS, run with PYTHONPATH inside the tree,
in the test environment) must pass every FAIL_TO_PASS and PASS_TO_PASS
test of the task. Grades are kept by the patch's digest, so two samples
that submit the same patch are graded once. Writes RESULT: the grade, the
patch's digest, nothing the trajectory says (cairn reads that itself).

Exit 75 when the agent was stopped by the server or the network (an error
status, no answer): infrastructure, the sample is tried again. Exit 0 when
the agent ended on its own terms (submitted, out of steps or time, format
errors); anything else is an error."""

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time

from common import (INFRA, copy_tree, environment_digest, read_json, run_tests, temp_dir, venv,
                    write_json)

# How mini-swe-agent ends a run it stopped itself (`info.exit_status`).
AGENT_ENDS = {"Submitted", "LimitsExceeded", "TimeExceeded", "RepeatedFormatError"}
# litellm's exceptions for a server that failed or could not be reached.
SERVER_FAILURES = {"InternalServerError", "ServiceUnavailableError", "BadGatewayError", "APIConnectionError",
                   "APIError", "Timeout", "RateLimitError"}


def checkout(tree, bug, path):
    """A git checkout of the bugged repository at `path`: the clean tree
    with the bug applied, committed, so `git diff` shows only the agent's
    edits."""
    copy_tree(tree, path)
    git = ["git", "-c", "user.name=cairn", "-c", "user.email=cairn@localhost", "-c", "init.defaultBranch=main"]
    subprocess.run(git + ["init", "-q"], cwd=path, check=True)
    subprocess.run(git + ["apply", os.path.abspath(bug)], cwd=path, check=True)
    subprocess.run(git + ["add", "-A"], cwd=path, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "the task"], cwd=path, check=True)


def problem_statement(task_id, record):
    failing = record["FAIL_TO_PASS"]
    shown = "\n".join(f"  {test}" for test in failing[:5])
    more = f"\n  … and {len(failing) - 5} more" if len(failing) > 5 else ""
    return f"Task: {task_id}\n\nThese tests of the repository fail, and should pass:\n{shown}{more}"


def run_agent(mini, profile, model, seed, work, task, trajectory, path_dirs, pythonpath, home):
    """Runs mini-swe-agent once; its exit code."""
    base = os.environ.get("OPENAI_BASE_URL")
    if not base:
        sys.exit("no model server: OPENAI_BASE_URL is not set (the stage uses `services = [\"model-server\"]`)")
    env = {"PATH": os.pathsep.join(path_dirs + [os.environ.get("PATH", "")]), "HOME": home,
           "PYTHONPATH": pythonpath, "PYTHONDONTWRITEBYTECODE": "1",
           "OPENAI_API_BASE": base, "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "none"),
           # No first-run wizard, no banner, no cost map from the internet,
           # and a server error ends the run at once: the canary retries it
           # as an attempt on record.
           "MSWEA_CONFIGURED": "true", "MSWEA_SILENT_STARTUP": "1",
           "MSWEA_GLOBAL_CONFIG_DIR": os.path.join(home, "mini-swe-agent"),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1"}
    command = [mini, "-c", os.path.abspath(profile), "-c", f"model.model_name=openai/{model}",
               "-c", f"model.model_kwargs.seed={seed}", "-c", f"environment.cwd={work}",
               "-t", task, "-o", os.path.abspath(trajectory), "--yolo", "--exit-immediately"]
    done = subprocess.run(command, cwd=work, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        print(done.stdout[-3000:], file=sys.stderr)
    return done.returncode


def grade(patch, record, tree, bug, repo, python, requirements, grades):
    """The grade of `patch`: kept under its digest (and the task's and the
    test environment's), so it is graded once."""
    digest = hashlib.sha256(patch.encode()).hexdigest()
    key = hashlib.sha256(f"{record['instance_id']}\0{digest}\0{environment_digest(requirements)}".encode()).hexdigest()
    os.makedirs(grades, exist_ok=True)
    kept = os.path.join(grades, f"{key}.json")
    with open(kept + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(kept):
            return {**read_json(kept), "reused": True}
        with temp_dir() as tmp:
            work = os.path.join(tmp, "tree")
            checkout(tree, bug, work)
            with open(os.path.join(tmp, "submission.diff"), "w") as f:
                f.write(patch)
            applied = subprocess.run(["git", "apply", os.path.join(tmp, "submission.diff")], cwd=work,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if applied.returncode != 0:
                outcome = {"applies": False, "why": applied.stdout.strip()[-500:]}
            else:
                outcomes, _, _ = run_tests(python, work, repo, 1800, os.path.join(tmp, "junit.xml"))
                counts = {}
                for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
                    tests = record[name]
                    counts[name] = {"passed": sum(outcomes.get(t) == "passed" for t in tests), "of": len(tests)}
                outcome = {"applies": True, **counts}
        outcome["resolved"] = bool(outcome["applies"]) and all(
            outcome[name]["passed"] == outcome[name]["of"] for name in ("FAIL_TO_PASS", "PASS_TO_PASS"))
        outcome["patch_sha256"] = digest
        write_json(kept, outcome)
        return {**outcome, "reused": False}


def main(model, task_id, task_dir, tree, tests, pythonpath, profile, agent_wheels, agent_requirements,
         test_wheels, test_requirements, trajectory, result):
    record = read_json(os.path.join(task_dir, "task.json"))
    bug = os.path.join(task_dir, "bug.diff")
    repo = {"tests": tests, "pythonpath": pythonpath}
    seed = int(os.environ.get("CAIRN_SEED", "0"))
    started = time.time()
    agent_python = venv("agent", agent_requirements, agent_wheels, no_deps=True)
    test_python = venv("test", test_requirements, test_wheels)
    os.makedirs(os.path.dirname(os.path.abspath(trajectory)), exist_ok=True)
    with temp_dir() as tmp:
        work = os.path.join(tmp, "repo")
        checkout(tree, bug, work)
        code = run_agent(os.path.join(os.path.dirname(agent_python), "mini"), profile, model, seed, work,
                         problem_statement(task_id, record), trajectory, [os.path.dirname(test_python)],
                         os.path.join(work, pythonpath), tmp)
    try:
        info = read_json(trajectory)["info"]
    except (OSError, ValueError, KeyError) as error:
        sys.exit(f"mini-swe-agent exited {code} and left no trajectory: {error}")
    status = info.get("exit_status")
    if status in SERVER_FAILURES:
        print(f"{model} {task_id} seed {seed}: the model server failed ({status}): infrastructure", file=sys.stderr)
        sys.exit(INFRA)
    if status not in AGENT_ENDS:
        sys.exit(f"{model} {task_id} seed {seed}: mini-swe-agent stopped on {status} (exit {code})")
    patch = info.get("submission") or ""
    outcome = {"model": model, "task": task_id, "profile": os.path.splitext(os.path.basename(profile))[0],
               "seed": seed, "submitted": status == "Submitted",
               "started_at": round(started, 3)}
    if status == "Submitted" and patch.strip():
        graded = grade(patch, record, tree, bug, repo, test_python, test_requirements,
                       "state/swesmith-real/canary/grades")
        outcome.update(graded=graded, reward=int(graded["resolved"]), patch_sha256=graded["patch_sha256"])
    else:
        outcome.update(graded=None, reward=0)
    outcome["ended_at"] = round(time.time(), 3)
    write_json(result, outcome)
    print(f"{model} {task_id} seed {seed}: {status}, reward {outcome['reward']}")


if __name__ == "__main__":
    main(*sys.argv[1:])
