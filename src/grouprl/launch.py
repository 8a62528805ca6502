"""Starting a run on several processes, and building the trainer each process runs.

    grouprl train --nproc 4 ...                                   4 processes on this machine
    torchrun --nproc-per-node 4 -m grouprl train ...              the same, started by hand
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint host0:29500 --rdzv-id run1 -m grouprl train ...   (on each machine, its rank)

``--nproc`` checks the config first (its errors come before any process starts), writes it,
resolved, to a temporary YAML file and runs torchrun on it, so every process trains with exactly
the same settings. Under torchrun each process joins the process group (:func:`join_run`) and
builds a :class:`~grouprl.trainer.dist_grpo.DistributedGRPOTrainer`; only the first process
writes the report and prints the closing lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from grouprl.config import ConfigError, TrainConfig, save_yaml
from grouprl.trainer.distributed import torchrun_world_size


def torchrun_command(nproc: int, config_path: Path) -> list[str]:
    """The torchrun command line that trains with the YAML config at ``config_path`` on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "grouprl", "train", "--config", str(config_path)]


def check_world_size(config: TrainConfig, world_size: int) -> None:
    """Refuse, before anything is loaded, a config that cannot be split over ``world_size`` processes."""
    from grouprl.trainer.dist_grpo import world_size_problems

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
        return subprocess.run(torchrun_command(nproc, path), env=env, check=False).returncode


def join_run(config: TrainConfig) -> Any:
    """This process's :class:`~grouprl.trainer.distributed.DistEnv` under torchrun with several
    processes (the process group joined), or None in a one-process run."""
    world = torchrun_world_size()
    if world <= 1:
        return None
    check_world_size(config, world)
    from grouprl.trainer.distributed import init_distributed

    return init_distributed()


def leave_run(env: Any) -> None:
    if env is not None:
        import torch.distributed as dist

        dist.destroy_process_group()


def build_trainer(config: TrainConfig, inputs: Any, policy: Any, tokenizer: Any, env: Any = None) -> Any:
    """The GRPO trainer for ``config``: one-process, or distributed when ``env`` is given; with
    ``rollout_engine=vllm`` its rollouts go through a colocated vLLM engine."""
    kwargs = dict(policy=policy, tokenizer=tokenizer, reward_fns=inputs.reward_fns, train_data=inputs.train_rows,
                  eval_data=inputs.eval_rows or None, reward_weights=inputs.reward_weights,
                  is_correct=inputs.is_correct, system_prompt=inputs.system_prompt, run_config=config)
    if env is None:
        from grouprl.trainer.grpo import GRPOTrainer

        trainer = GRPOTrainer(config, **kwargs)
    else:
        from grouprl.trainer.dist_grpo import DistributedGRPOTrainer

        trainer = DistributedGRPOTrainer(config, env=env, **kwargs)
    if config.rollout_engine == "vllm":
        use_vllm(trainer)
    return trainer


def use_vllm(trainer: Any) -> Any:
    """Give ``trainer`` a colocated vLLM engine as its sampler, following its policy's weights
    (settings from the trainer's config: vllm_gpu_memory_utilization, vllm_sleep, lora_rank)."""
    from grouprl.rollout.vllm import VLLMSampler
    from grouprl.trainer.distributed import unwrap

    c = trainer.config
    sampler = VLLMSampler(unwrap(trainer.policy), trainer.tokenizer, max_model_len=c.max_prompt_len + c.max_new_tokens,
                          gpu_memory_utilization=c.vllm_gpu_memory_utilization, sleep=c.vllm_sleep, seed=c.seed,
                          lora_rank=c.lora_rank or None)
    sampler.track(trainer.optimizer)
    trainer.sampler = sampler
    return sampler
