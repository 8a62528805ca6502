"""Rollout servers for the tests of grouprl.serve, started the way a run starts them
(:class:`grouprl.serve.local.LocalServers`) but from a process of their own, so a test can kill that
process and check that the servers die with it: ``python -m tests.helpers.servers MODEL_DIR N LOG_DIR
[grouprl serve options]`` prints one JSON line (addresses, server pids) and waits until it is killed."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

TINY64 = dict(hidden_size=128, num_heads=2, num_kv_heads=2)
"""A tiny Llama with head size 64: vLLM's CPU attention takes no smaller head."""


def write_tiny64(folder: Path, seed: int = 0) -> Path:
    """The tiny head-64 model of ``seed`` as a model folder a server loads."""
    from grouprl.models import tiny_causal_lm
    from grouprl.serve.transport import write_model_folder

    model, tok = tiny_causal_lm(seed=seed, **TINY64)
    folder.mkdir(parents=True, exist_ok=True)
    write_model_folder(model, tok, folder, None)
    return folder


def main(argv: list[str]) -> None:
    from grouprl.serve.local import LocalServers

    model, count, log_dir, *options = argv
    servers = LocalServers(int(count), model, options, log_dir)
    print(json.dumps({"addresses": servers.addresses, "pids": [p.pid for p in servers.processes]}), flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
