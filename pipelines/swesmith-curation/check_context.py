#!/usr/bin/env python3
"""check_context.py AGENT SERVER TRAINER: the context length agrees
everywhere: the agent profile's `max_context` (AGENT), the model server's
`max_model_len` (SERVER) and the trainer's `max_seq_len` (TRAINER). Exits 1
naming each when they disagree."""

import json
import sys

from common import agent_profile, trainer_context


def context_lengths(agent, server, trainer):
    with open(server) as f:
        s = json.load(f)["max_model_len"]
    return {"agent": agent_profile(agent)["max_context"], "server": s, "trainer": trainer_context(trainer)}


def check_context(agent, server, trainer):
    lengths = context_lengths(agent, server, trainer)
    if len(set(lengths.values())) != 1:
        print("context length disagrees: " + ", ".join(f"{k} {v}" for k, v in lengths.items()))
        sys.exit(1)
    print(f"context length {lengths['agent']} everywhere")


if __name__ == "__main__":
    check_context(*sys.argv[1:])
