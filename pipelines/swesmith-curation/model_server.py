#!/usr/bin/env python3
"""A small model server for the canary, speaking the OpenAI-compatible API
vLLM and SGLang serve:

    model_server.py --port PORT --models DIR --config SERVER_JSON

    GET  /v1/models             every checkpoint under DIR, as vLLM lists
                                them (id, root, max_model_len)
    POST /v1/chat/completions   a chat completion, drawn from the request's
                                `seed`: the same (model, prompt, seed) gives
                                the same answer, another seed may not

Each checkpoint is a directory (config.json, model.safetensors,
tokenizer.json, chat_template.jinja) whose `config.json` holds the fixture's
skill: how often it fixes the task it is shown (`accuracy`), answers
nothing (`empty_rate`), or is too busy to answer the first time it is asked
(`infra_rate`: HTTP 503, as an overloaded server answers; asked again, it
answers). The served context length is the launch config's
`max_model_len`, as `vllm serve --max-model-len` sets it.
"""

import argparse
import hashlib
import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def frac(*parts):
    text = "\0".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") / 2**64


class Models:
    def __init__(self, root, max_model_len):
        self.max_model_len = max_model_len
        self.models = {}
        for name in sorted(os.listdir(root)):
            path = os.path.join(root, name)
            config = os.path.join(path, "config.json")
            if os.path.isfile(config):
                with open(config) as f:
                    self.models[name] = {"root": os.path.abspath(path), "config": json.load(f)}
        self.created = int(time.time())
        # (model, prompt, seed) asked once already: a busy answer is not
        # given twice.
        self.asked = set()
        self.lock = threading.Lock()

    def listing(self):
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": self.created, "owned_by": "cairn-fixture",
             "root": model["root"], "parent": None, "max_model_len": self.max_model_len}
            for name, model in self.models.items()]}

    def complete(self, request):
        """(status, body) for a chat completion request."""
        name = request.get("model")
        if name not in self.models:
            return 404, {"error": {"message": f"The model `{name}` does not exist.",
                                   "type": "NotFoundError", "code": 404}}
        messages = request.get("messages") or []
        if not messages:
            return 400, {"error": {"message": "messages must not be empty", "type": "BadRequestError"}}
        fixture = self.models[name]["config"]["fixture"]
        prompt = json.dumps(messages, sort_keys=True)
        seed = request.get("seed", 0)
        key = (name, prompt, seed)
        with self.lock:
            first = key not in self.asked
            self.asked.add(key)
        if first and frac(name, prompt, seed, "busy") < fixture["infra_rate"]:
            return 503, {"error": {"message": "the server is overloaded; try again", "type": "ServiceUnavailable"}}
        task = re.search(r"Task: (\S+)", messages[-1].get("content", ""))
        task = task.group(1) if task else prompt
        if frac(fixture["revision"], task, "empty", seed) < fixture["empty_rate"]:
            content = ""
        elif frac(name, task, "solve", seed) < fixture["accuracy"]:
            content = ("THOUGHT: the failing test shows the implementation is wrong.\n"
                       "ACTION: edit-implementation")
        else:
            content = ("THOUGHT: the test expectation looks outdated.\n"
                       "ACTION: edit-tests")
        tokens = len(content.split())
        return 200, {
            "id": "chatcmpl-" + hashlib.sha256(f"{prompt}{seed}".encode()).hexdigest()[:24],
            "object": "chat.completion", "created": int(time.time()), "model": name,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": tokens,
                      "total_tokens": len(prompt.split()) + tokens},
        }


def handler(models):
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
                self.answer(200, models.listing())
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
                self.answer(*models.complete(request))
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
    parser.add_argument("--max-model-len", type=int, required=True, help="the context length served")
    args = parser.parse_args()
    max_model_len = args.max_model_len
    models = Models(args.models, max_model_len)
    server = ThreadingHTTPServer((args.host, args.port), handler(models))
    print(f"serving {', '.join(models.models)} on http://{args.host}:{args.port}/v1 "
          f"(max_model_len {max_model_len})", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
