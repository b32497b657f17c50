#!/usr/bin/env python3
"""A scripted policy behind the OpenAI-compatible API vLLM serves, for the
canary on a machine with no GPU:

    policy_server.py --port PORT --models DIR --tasks FREEZE [--only NAME]
                     [--max-model-len N] [--serve NAME.PROFILE]

    GET  /v1/models             every checkpoint under DIR (or only NAME, as
                                one vLLM process serves one model), as vLLM
                                lists them (id, root, max_model_len: N, as
                                `vllm serve --max-model-len N`, or the
                                checkpoint's own)
    POST /v1/chat/completions   the next step of an agent on a task of the
                                freeze FREEZE (its `items/ID/`), drawn from
                                the request's `seed`

It is not a model, but it drives a real agent: each answer is one shell
command in a ```bash block, run by the harness in the task's checkout, and
what it does depends on how the sample was drawn. Each checkpoint's
`config.json` holds its policy, the share of samples that

    solve    read the bugged file, run a failing test, apply the fix (the
             task's gold patch, through `git apply`), run the test again,
             submit
    miss     do the same with an edit that fixes nothing, and submit
    wander   look around and never submit (the step limit ends them)
    silent   solve, but the server reports no completion tokens for any
             answer (the empty trajectory the grader would pass)
    busy     are answered 503 the first time they ask (an overloaded
             server), then solve

and `format`: `bash` (as above) or `tool-call`, a model whose answers come
as tool calls the text-based harness cannot read: every answer is a format
error. The same (model, task, seed) always draws the same behaviour.
"""

import argparse
import hashlib
import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from canary_common import server_parts

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached"
BEHAVIOURS = ("solve", "miss", "wander", "silent", "busy")


def frac(*parts):
    text = "\0".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") / 2**64


def behaviour(policy, model, task, seed):
    """The behaviour a sample of `model` on `task` with `seed` was drawn."""
    draw = frac(model, task, seed, "behaviour")
    total = sum(policy.get(b, 0) for b in BEHAVIOURS)
    for name in BEHAVIOURS:
        share = policy.get(name, 0) / total
        if draw < share:
            return name
        draw -= share
    return BEHAVIOURS[0]


class Policy:
    def __init__(self, models_dir, freeze, only=None, max_model_len=None):
        self.freeze = freeze
        self.max_model_len = max_model_len
        self.models = {}
        for name in sorted(os.listdir(models_dir)):
            if only is not None and name != only:
                continue
            config = os.path.join(models_dir, name, "config.json")
            if os.path.isfile(config):
                with open(config) as f:
                    self.models[name] = {"root": os.path.abspath(os.path.join(models_dir, name)),
                                         "config": json.load(f)}
        self.created = int(time.time())
        # Samples answered 503 once already: a busy answer is not given twice.
        self.busy_once = set()
        self.lock = threading.Lock()

    def listing(self):
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": self.created, "owned_by": "cairn-fixture",
             "root": model["root"], "parent": None,
             "max_model_len": self.max_model_len or model["config"]["max_model_len"]}
            for name, model in self.models.items()]}

    def task(self, task_id):
        item = os.path.join(self.freeze, "items", task_id)
        with open(os.path.join(item, "task.json")) as f:
            record = json.load(f)
        with open(os.path.join(item, "gold.diff")) as f:
            return record, f.read()

    def command(self, kind, step, record, gold):
        """The shell command of answer number `step` (0-based)."""
        test = record["FAIL_TO_PASS"][0]
        if kind == "wander":
            return ["git status --short", f"head -40 {record['file']}", "ls", "git log --oneline -3"][step % 4]
        if kind == "miss":
            fix = f"printf '\\n# the failing test was read here\\n' >> {record['file']}"
        else:
            fix = f"git apply <<'CAIRN_PATCH'\n{gold.rstrip()}\nCAIRN_PATCH"
        script = [f"head -60 {record['file']}",
                  f"python -m pytest -q -x --tb=line '{test}' | tail -5",
                  fix,
                  f"python -m pytest -q -x --tb=line '{test}' | tail -5",
                  SUBMIT]
        return script[min(step, len(script) - 1)]

    def complete(self, request):
        """(status, body) for a chat completion request."""
        name = request.get("model")
        if name not in self.models:
            return 404, {"error": {"message": f"The model `{name}` does not exist.",
                                   "type": "NotFoundError", "code": 404}}
        messages = request.get("messages") or []
        if not messages:
            return 400, {"error": {"message": "messages must not be empty", "type": "BadRequestError"}}
        config = self.models[name]["config"]
        seed = request.get("seed", 0)
        found = re.search(r"Task: (\S+)", "\n".join(str(m.get("content", "")) for m in messages[:2]))
        if not found:
            return 400, {"error": {"message": "no `Task: ID` in the instance prompt", "type": "BadRequestError"}}
        task_id = found.group(1)
        try:
            record, gold = self.task(task_id)
        except OSError:
            return 400, {"error": {"message": f"no task `{task_id}` in the freeze", "type": "BadRequestError"}}
        kind = behaviour(config["policy"], name, task_id, seed)
        step = sum(1 for m in messages if m.get("role") == "assistant")
        if kind == "busy":
            with self.lock:
                first = (name, task_id, seed) not in self.busy_once
                self.busy_once.add((name, task_id, seed))
            if first:
                return 503, {"error": {"message": "the server is overloaded; try again", "type": "ServiceUnavailable"}}
        command = self.command(kind, step, record, gold)
        message = {"role": "assistant"}
        if config.get("format", "bash") == "tool-call":
            message["content"] = None
            message["tool_calls"] = [{"id": f"call_{step}", "type": "function",
                                      "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]
        else:
            message["content"] = f"THOUGHT: step {step + 1} of the task.\n\n```bash\n{command}\n```\n"
        text = message["content"] or command
        prompt_tokens = sum(len(str(m.get("content") or "")) for m in messages) // 4
        completion_tokens = 0 if kind == "silent" else max(1, len(text) // 4)
        return 200, {
            "id": "chatcmpl-" + hashlib.sha256(f"{name}{task_id}{seed}{step}".encode()).hexdigest()[:24],
            "object": "chat.completion", "created": int(time.time()), "model": name,
            "choices": [{"index": 0, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                         "message": message}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }


def handler(policy):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self, status, body):
            data = (json.dumps(body) + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.rstrip("/") == "/v1/models":
                self.answer(200, policy.listing())
            elif self.path == "/health":
                self.answer(200, {})
            else:
                self.answer(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            try:
                request = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError as error:
                self.answer(400, {"error": {"message": f"not JSON: {error}"}})
                return
            if self.path.rstrip("/") == "/v1/chat/completions":
                self.answer(*policy.complete(request))
            else:
                self.answer(404, {"error": {"message": f"no route {self.path}"}})

        def log_message(self, format, *args):
            print("%s %s" % (self.address_string(), format % args), flush=True)

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--models", required=True)
    parser.add_argument("--tasks", required=True, help="the registered freeze the canary's tasks come from")
    parser.add_argument("--only", help="serve this checkpoint alone")
    parser.add_argument("--max-model-len", type=int, help="the context served (default: each checkpoint's own)")
    parser.add_argument("--serve", metavar="NAME.PROFILE",
                        help="the server a canary trial needs: NAME alone, at the evaluation profile's context")
    args = parser.parse_args()
    if args.serve:
        args.only, _, args.max_model_len = server_parts(args.serve)
    policy = Policy(args.models, args.tasks, args.only, args.max_model_len)
    if not policy.models:
        parser.error(f"no checkpoint to serve under {args.models}" + (f" named {args.only}" if args.only else ""))
    longest = min(model["config"]["max_model_len"] for model in policy.models.values())
    if args.max_model_len and args.max_model_len > longest:
        parser.error(f"--max-model-len {args.max_model_len} is more than a checkpoint holds ({longest})")
    server = ThreadingHTTPServer((args.host, args.port), handler(policy))
    print(f"serving {', '.join(policy.models)} on http://{args.host}:{args.port}/v1", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
