"""Rollout servers for the tests of grouprl.serve, started the way a run starts them
(:class:`grouprl.trainer.local_servers.LocalServers`) but from a process of their own, so a test can kill that
process and check that the servers die with it: ``python -m tests.helpers.servers MODEL_DIR N LOG_DIR
[grouprl serve options]`` prints one JSON line (addresses, server pids, their token) and waits until it is killed.
While :func:`started` runs, ``GROUPRL_SERVER_TOKEN`` holds the servers' token, so a ServerSampler made in the
test sends it; :func:`auth` is the header for requests a test makes itself."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from grouprl.serve.server.guard import TOKEN_ENV
from grouprl.serve.server.parent import kill_group

TINY64 = dict(hidden_size=128, num_heads=2, num_kv_heads=2)
"""A tiny Llama with head size 64: vLLM's CPU attention takes no smaller head."""


def write_tiny64(folder: Path, seed: int = 0) -> Path:
    """The tiny head-64 model of ``seed`` as a model folder a server loads."""
    from grouprl.models import tiny_causal_lm
    from grouprl.serve.weights.transport import reading, write_model_folder

    model, tok = tiny_causal_lm(seed=seed, **TINY64)
    folder.mkdir(parents=True, exist_ok=True)
    write_model_folder(model, tok, folder, reading(model))
    return folder


def tiny_server_info(transfer: str | None) -> dict:
    """What ``GET /grouprl/info`` of a server of the default tiny model answers, with weight transfer ``transfer``
    (for fake servers: they answer it and nothing else as a real one would)."""
    from grouprl.models import tiny_causal_lm

    config = tiny_causal_lm()[0].config
    return {"version": None, "adapter": None, "model": "tiny", "dtype": "fp32", "max_model_len": 256, "lora_rank": None,
            "weight_transfer": transfer, "workers": 1,
            "facts": {"vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
                      "num_hidden_layers": config.num_hidden_layers}}


class JsonHandler(BaseHTTPRequestHandler):
    """A fake server's request handler: quiet, answering JSON (:meth:`reply`)."""

    def log_message(self, *_):
        pass

    def reply(self, body, code: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FakeServer:
    """``handler`` served on 127.0.0.1 (a free port) from a daemon thread, by ``server_class``."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], server_class: type = ThreadingHTTPServer):
        self.http = server_class(("127.0.0.1", 0), handler)
        self.http.daemon_threads = True
        self.address = f"127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (read from /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def auth(token: str | None = None) -> dict[str, str]:
    """The Authorization header of a request to the servers of :func:`started` (or with ``token``)."""
    return {"Authorization": f"Bearer {token or os.environ[TOKEN_ENV]}"}


@contextlib.contextmanager
def started(root: Path, count: int, max_rows: int, options: tuple[str, ...] = ()) -> Iterator[dict]:
    """``count`` servers of the tiny head-64 model (seed 0) from a helper process, fp32, 256 positions:
    ``{addresses, pids, token, helper, logs}``, ``GROUPRL_SERVER_TOKEN`` set to their token meanwhile; afterwards
    the helper and the servers' whole process groups are killed (whatever a failed test left), sparing the
    resource trackers that remove vLLM's shared memory. ``options``: more ``grouprl serve`` options."""
    folder = write_tiny64(root / "model", seed=0)
    helper = subprocess.Popen([sys.executable, "-m", "tests.helpers.servers", str(folder), str(count),
                               str(root / "logs"), "--rollout_dtype", "fp32", "--max_model_len", "256",
                               "--max_rows", str(max_rows), *options],
                              stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[2])
    info = json.loads(helper.stdout.readline())
    info.update(helper=helper, logs=root / "logs")
    before = os.environ.get(TOKEN_ENV)
    os.environ[TOKEN_ENV] = info["token"]
    try:
        yield info
    finally:
        if before is None:
            os.environ.pop(TOKEN_ENV, None)
        else:
            os.environ[TOKEN_ENV] = before
        helper.kill()
        helper.wait()
        for pid in info["pids"]:
            kill_group(pid)


def main(argv: list[str]) -> None:
    from grouprl.trainer.local_servers import LocalServers

    model, count, log_dir, *options = argv
    servers = LocalServers(int(count), model, options, log_dir)
    print(json.dumps({"addresses": servers.addresses, "pids": [p.pid for p in servers.processes],
                      "token": servers.token}), flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
