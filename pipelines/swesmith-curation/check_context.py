#!/usr/bin/env python3
"""check_context.py AGENT SERVER TRAINER: before training, the context
length agrees across what training runs with: the training rollouts'
agent profile's `max_context` (AGENT, e.g. `training-64k`), the training
model server's `max_model_len` (SERVER, its launch config) and the
trainer's `max_seq_len` (TRAINER). Exits 1 naming each when they
disagree. The selection canary's profile is checked against its own
server (check_served.py), not tied to the trainer's."""

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
    print(f"context length {lengths['agent']} everywhere training runs ({agent_profile(agent)['name']})")


if __name__ == "__main__":
    check_context(*sys.argv[1:])
