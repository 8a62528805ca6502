"""Starting a run on several processes, and building the trainer each process runs.

    grouprl train --nproc 4 ...                                   4 processes on this machine
    torchrun --nproc-per-node 4 -m grouprl train ...              the same, started by hand

``--nproc`` writes the checked config to a temporary YAML file and runs torchrun on it: every process, one config.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from grouprl.config import TrainConfig, save_yaml
from grouprl.errors import ConfigError
from grouprl.run.folder import CLAIMED_BY_PARENT
from grouprl.trainer.dist.group import torchrun_world_size


def torchrun_command(nproc: int, config_path: Path) -> list[str]:
    """The torchrun command line that trains with the YAML config at ``config_path`` on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "grouprl", "train", "--config", str(config_path)]


def check_world_size(config: TrainConfig, world_size: int) -> None:
    """Refuse, before anything is loaded, a config that cannot be split over ``world_size`` processes."""
    from grouprl.trainer.dist.processes import world_size_problems

    for msg in world_size_problems(config, world_size):
        raise ConfigError(msg)


def launch(config: TrainConfig, nproc: int) -> int:
    """Train with ``config`` in ``nproc`` processes on this machine; returns torchrun's exit status."""
    if nproc < 1:
        raise ConfigError(f"--nproc {nproc}: give a number of processes >= 1")
    check_world_size(config, nproc)
    with tempfile.TemporaryDirectory(prefix="grouprl-launch-") as tmp:
        path = Path(tmp) / "config.yaml"
        save_yaml(config, path)
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun picks anyway (with a warning): ranks share cores
        env[CLAIMED_BY_PARENT] = str(Path(config.output_dir).resolve())  # this process holds the folder
        return subprocess.run(torchrun_command(nproc, path), env=env, check=False).returncode


def join_run(config: TrainConfig) -> Any:
    """This process's ``DistEnv``: torchrun's group, a group of one on a GPU machine, None on a CPU."""
    from grouprl.trainer.dist.group import init_distributed, one_process_init_method

    world = torchrun_world_size()
    if world <= 1 and not torch.cuda.is_available():
        return None
    if world <= 1 and (why := one_gpu_problem(config)):
        warnings.warn(f"{why}: this run trains on the CPU", stacklevel=2)
        return None
    check_world_size(config, world)
    if world <= 1 and "MASTER_ADDR" not in os.environ:  # not under torchrun: no rendezvous to read
        return init_distributed(rank=0, world_size=1, init_method=one_process_init_method(), device="cuda")
    return init_distributed()


def one_gpu_problem(config: TrainConfig) -> str | None:
    """Why a one-process run of ``config`` cannot train on this machine's GPU (None: it can)."""
    from grouprl.trainer.dist.processes import placement_problems

    return next(iter(placement_problems(config)), None)


def leave_run(env: Any) -> None:
    if env is not None:
        import torch.distributed as dist

        if dist.is_initialized():  # a vLLM engine's close may already have destroyed it with its own groups
            dist.destroy_process_group()
