"""Peak memory is the measuring process's own, not inherited from the process that started it."""

from __future__ import annotations

import subprocess
import sys

import torch

from grouprl.run.logs import peak_rss_mb


def test_a_spawned_process_reports_its_own_peak_not_its_parents():
    block = torch.ones(100 * 2**20)  # 400 MiB touched in this process
    parent = peak_rss_mb()
    code = "from grouprl.run.logs import peak_rss_mb; print(peak_rss_mb())"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    del block
    assert parent > 400
    assert float(child.stdout) < parent - 300  # a bare interpreter: tens of MiB, whatever its parent held
