#!/usr/bin/env python3
"""serve_vllm.py CHECKPOINTS SERVER PORT: starts (execs) the vLLM server a
canary trial needs, SERVER = `MODEL.PROFILE`: the checkpoint
CHECKPOINTS/MODEL, served as MODEL on PORT at the context the evaluation
profile is named for (`official-32k`: `--max-model-len 32768`). A context
past the checkpoint's own (`max_position_embeddings` in its config.json)
is reached by YaRN rope scaling, as Qwen recommends for its models
(factor = context / native); that is part of the protocol, so the profile
says it by its name, and the service's check verifies the context served."""

import json
import os
import sys

from canary_common import server_parts


def vllm_command(checkpoints, server, port):
    model, _, context = server_parts(server)
    checkpoint = os.path.join(checkpoints, model)
    command = ["vllm", "serve", checkpoint, "--served-model-name", model, "--port", str(port),
               "--max-model-len", str(context)]
    with open(os.path.join(checkpoint, "config.json")) as f:
        native = json.load(f).get("max_position_embeddings")
    if native and context > native:
        scaling = {"rope_type": "yarn", "factor": context / native, "original_max_position_embeddings": native}
        command += ["--hf-overrides", json.dumps({"rope_scaling": scaling})]
    return command


if __name__ == "__main__":
    command = vllm_command(*sys.argv[1:])
    print(" ".join(command), flush=True)
    os.execvp(command[0], command)
