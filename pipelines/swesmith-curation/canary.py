#!/usr/bin/env python3
"""canary.py MODEL TASK_ID RECEIPT AGENT RESULT: one sample of one model on
one task of the registered freeze, through the model server at
$OPENAI_BASE_URL (a cairn service): the agent (the profile in AGENT) asks
once with the sample's seed ($CAIRN_SEED), the model answers with an
action, the action is applied to a copy of the task's repository and the
task's test decides the reward. Writes RESULT; an empty answer is zero
turns. No answer, or a server error, is infrastructure (exit 75)."""

import json
import os
import re
import shutil
import sys
import tempfile
import urllib.error
import urllib.request

from common import agent_profile, git_apply, registered, run_tests, write_json


def post_json(url, body, timeout=60):
    """(status, decoded body) of a JSON POST; raises OSError when no answer."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        try:
            return error.code, json.loads(error.read())
        except ValueError:
            return error.code, {}


def canary(model_name, task_id, receipt, agent_path, result):
    base = os.environ.get("OPENAI_BASE_URL")
    if not base:
        sys.exit("no model server: OPENAI_BASE_URL is not set (the stage uses `services = [\"model-server\"]`)")
    agent = agent_profile(agent_path)
    root, _ = registered(receipt)
    task_dir = os.path.join(root, "items", task_id)
    with open(os.path.join(task_dir, "task.json")) as f:
        meta = json.load(f)
    attempt = int(os.environ.get("CAIRN_ATTEMPT", "1"))
    seed = int(os.environ.get("CAIRN_SEED", "0"))
    messages = [
        {"role": "system", "content": f"You are a software engineering agent ({agent['prompt_profile']})."},
        {"role": "user", "content": f"Task: {task_id}\nThe test {meta['test']} fails. Fix the repository."},
    ]
    request = {"model": model_name, "messages": messages, "seed": seed,
               "temperature": agent["temperature"], "top_p": agent["top_p"],
               "max_tokens": agent["max_tokens"]}
    try:
        status, answer = post_json(base.rstrip("/") + "/chat/completions", request)
    except OSError as error:
        # No answer at all: the server, not the model.
        print(f"model server: {error}", file=sys.stderr)
        sys.exit(75)
    if status >= 500:
        print(f"model server answered {status}: {answer.get('error', {}).get('message', '')}", file=sys.stderr)
        sys.exit(75)
    if status != 200:
        sys.exit(f"model server refused the request ({status}): {answer.get('error', {}).get('message', '')}")
    if answer.get("model") != model_name:
        sys.exit(f"asked {model_name}, answered by {answer.get('model')}: the server serves another model")
    content = answer["choices"][0]["message"]["content"] or ""
    trajectory = [] if not content.strip() else [
        {"role": "assistant", "content": content},
        {"role": "tool", "content": "applied"},
    ]
    action = re.search(r"ACTION: (\S+)", content)
    action = action.group(1) if action else None
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "repo")
        shutil.copytree(os.path.join(task_dir, "repo"), repo)
        if action == "edit-implementation":
            git_apply(repo, os.path.join(task_dir, "gold.patch"))
        passed = bool(trajectory) and run_tests(repo, meta["test"])
    write_json(result, {"model": model_name, "task": task_id, "turns": len([t for t in trajectory if t["role"] == "assistant"]),
                        "reward": 1 if passed else 0, "action": action, "attempt": attempt, "seed": seed,
                        "usage": answer.get("usage", {})})
    print(f"{model_name} {task_id} seed {seed}: reward {1 if passed else 0}, action {action}")


if __name__ == "__main__":
    canary(*sys.argv[1:])
