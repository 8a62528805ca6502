"""Every check of a :class:`~grouprl.trainer.config.TrainerConfig`, before anything is loaded: names, ranges,
contradictions and keys the algorithm does not read, each a sentence naming the key and what to change."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from grouprl.algos import ADVANTAGES, AGGREGATIONS, IMPORTANCE_LEVELS, KL_ESTIMATORS, SCALES
from grouprl.algos.rollout_correction import ROLLOUT_IS_LEVELS
from grouprl.errors import ConfigError
from grouprl.registry import Registry
from grouprl.rollout.formats import FORMATS
from grouprl.run.loggers import logger_problems
from grouprl.run.optim import LR_SCHEDULES
from grouprl.serve.weights.transport import TRANSPORTS
from grouprl.trainer.algorithms import ALGORITHMS, KEY_GROUPS, KL_CONTROLLERS, Algorithm, owners
from grouprl.trainer.loss_variants import variant_problems
from grouprl.trainer.teacher import teacher_problems

if TYPE_CHECKING:
    from grouprl.trainer.config import TrainerConfig

ZERO_STD_POLICIES = ("keep", "drop")


def check(config: TrainerConfig, *more: Callable[[Any], list[str]]) -> None:
    """Raise :class:`ConfigError` naming every problem of ``config`` and those each of ``more`` finds."""
    try:
        found = problems(config) + [p for extra in more for p in extra(config)]
    except ConfigError:
        raise
    except ValueError as e:  # a registry's unknown name, a task's unknown option
        raise ConfigError(str(e)) from e
    if found:
        raise ConfigError("; ".join(found))


def problems(c: TrainerConfig) -> list[str]:
    if c.algo not in ALGORITHMS:
        ALGORITHMS.get(c.algo)  # raises with the closest valid names
    algo = ALGORITHMS.get(c.algo)
    out = logger_problems(c.loggers)
    return out + (_algorithm_problems(c, algo) + _registry_problems(c) + _range_problems(c) + _batch_problems(c)
            + _objective_problems(c) + _sampling_problems(c) + _scale_out_problems(c)
            + _trust_region_problems(c) + _estimator_problems(c) + variant_problems(c) + teacher_problems(c))


def _algorithm_problems(c: TrainerConfig, algo: Algorithm) -> list[str]:
    """Keys another algorithm owns set away from their defaults, and a contradicted definition."""
    out = []
    defaults = {f.name: f.default for f in dataclasses.fields(c) if f.default is not dataclasses.MISSING}
    for key in sorted({k for group in KEY_GROUPS.values() for k in group} - algo.keys):
        if getattr(c, key) != defaults.get(key):
            readers = ", ".join(owners(key))
            out.append(f"{key}={getattr(c, key)!r} is a setting of {readers}; algo={c.algo} does not read it: "
                       f"remove it or set --algo to one of {readers}")
    if algo.defines_advantage and c.advantage not in (None, algo.advantage):
        out.append(f"advantage={c.advantage!r}: algo={c.algo} is defined by advantage={algo.advantage}; for "
                   "another estimator with the same update use --algo grpo --advantage NAME")
    return out


def _registry_problems(c: TrainerConfig) -> list[str]:
    checks: list[tuple[str, Any, Registry | tuple[str, ...]]] = [
        ("advantage", c.advantage_estimator, ADVANTAGES),
        ("advantage_scale", c.advantage_scale or "group", SCALES),
        ("aggregation", c.aggregation, AGGREGATIONS), ("kl_estimator", c.kl_estimator, KL_ESTIMATORS),
        ("importance_level", c.importance_level, IMPORTANCE_LEVELS),
        ("zero_std_groups", c.zero_std_groups, ZERO_STD_POLICIES),
        ("kl_controller", c.kl_controller_name, KL_CONTROLLERS), ("lr_schedule", c.lr_schedule, LR_SCHEDULES),
        ("dtype", c.dtype, ("auto", "fp32", "bf16")), ("ref_dtype", c.ref_dtype, ("auto", "fp32", "bf16")),
        ("rollout_dtype", c.rollout_dtype, ("auto", *FORMATS.names())),
        ("rollout_mode", c.rollout_mode, ("sample", "beam")), ("engine", c.engine, ("fsdp", "ddp")),
        ("mixed_precision", c.mixed_precision, ("none", "bf16")),
        ("rollout_engine", c.rollout_engine, ("auto", "hf", "vllm")),
        ("rollout_is", c.rollout_is, ("auto", "none", *ROLLOUT_IS_LEVELS.names())),
    ]
    return [f"{name}={value!r} is not one of: {', '.join(valid)}" for name, value, valid in checks
            if value not in valid]


BOUNDS: dict[str, str] = {
    "lr": "a finite number > 0", "critic_lr": "a finite number > 0 (or empty: lr)", "adam_beta1": "in [0, 1)",
    "adam_beta2": "in [0, 1)", "top_p": "in (0, 1] (1 = off)", "min_p": "in [0, 1)",
    "repetition_penalty": "> 0 (1 = off)", "eval_temperature": ">= 0 (0 = greedy)", "beta": ">= 0",
    "dual_clip": "> 1 (or empty)", "ref_sync_alpha": "in (0, 1]", "tool_timeout_s": "> 0",
    "agent_timeout": "> 0",
    "vllm_gpu_memory_utilization": "in (0, 1)", "rollout_is_cap": "> 0",
    "vllm_kv_cache_gib": "> 0 (or empty: sized to the run)", "accept_ratio": "in (0, 1]", "gigpo_gamma": "in [0, 1]",
    "gigpo_similarity": "in (0, 1] (or empty: equal keys only)", "top_entropy_quantile": "in (0, 1] (1 = every token)",
    "cispo_eps_high": "a finite number >= 0", "cispo_eps_low": "in [0, 1] (or empty: no lower bound)",
    "sapo_tau_pos": "a finite number > 0", "sapo_tau_neg": "a finite number > 0", "eps_low": "in (0, 1)",
    "gamma": "in (0, 1]", "gae_lambda": "in [0, 1]", "vf_clip": "> 0 (or empty)", "max_kl": "> 0", "kl_target": "> 0",
    **dict.fromkeys(("weight_decay", "max_grad_norm", "warmup_steps", "save_every", "eval_every", "entropy_coef",
                     "advantage_eps", "top_k", "log_completions_every", "print_completions", "keep_checkpoints",
                     "num_threads", "ref_sync_steps", "critic_warmup_steps",
                     "gigpo_step_weight", "eps_high", "lora_rank", "max_tool_calls", "vf_coef", "damping",
                     "total_steps", "gmpo_eps_low", "gmpo_eps_high"), ">= 0"),
    **dict.fromkeys(("prompts_per_step", "mu", "max_new_tokens", "max_prompt_len", "eval_samples", "max_turns",
                     "dynamic_sampling_max_rounds", "kl_horizon", "cg_iters", "backtracks", "fisher_stride"), ">= 1"),
}
"""Key -> its range as the message says it (``> x``, ``>= x`` or ``in [lo, hi)``, a note); None passes."""
_BOUND = re.compile(r"(?:a finite number )?(?:(>=|>) (\S+)|in ([\[(])(\S+), (\S+?)([\])]))(?: \(.*\))?")


def within(value: float, bound: str) -> bool:
    """Whether ``value`` keeps ``bound`` (an entry of :data:`BOUNDS`); never for NaN or an infinity."""
    op, low, left, lo, hi, right = _BOUND.fullmatch(bound).groups()
    if not math.isfinite(value):
        return False
    if op:
        return value >= float(low) if op == ">=" else value > float(low)
    above = value >= float(lo) if left == "[" else value > float(lo)
    return above and (value <= float(hi) if right == "]" else value < float(hi))


def _range_problems(c: TrainerConfig) -> list[str]:
    """Numbers that torch or the sampler would reject deep inside a run (or, worse, accept)."""
    out = [f"{key}={getattr(c, key)} must be {bound}" for key, bound in BOUNDS.items()
           if getattr(c, key) is not None and not within(getattr(c, key), bound)]
    if not math.isfinite(c.temperature):  # <= 0 is greedy sampling, refused with its reason below
        out.append(f"temperature={c.temperature} must be a finite number > 0")
    return out


def _batch_problems(c: TrainerConfig) -> list[str]:
    out = []
    if c.group_size < 2:
        out.append(f"group_size={c.group_size}: GRPO compares completions of the same prompt, set group_size >= 2")
    if c.minibatch_size is not None:
        if c.minibatch_size <= 0:
            out.append(f"minibatch_size={c.minibatch_size}: set a positive number of rows or leave it empty")
        elif c.minibatch_size % c.group_size or c.rollout_rows % c.minibatch_size:
            out.append(
                f"minibatch_size={c.minibatch_size} must be a multiple of group_size={c.group_size} (whole groups) "
                f"and divide prompts_per_step*group_size={c.rollout_rows}"
            )
    if c.micro_batch_size <= 0:
        out.append(f"micro_batch_size={c.micro_batch_size}: set a positive number of rows")
    return out


def _objective_problems(c: TrainerConfig) -> list[str]:
    out = []
    if c.kl_in_reward and c.beta == 0:
        out.append("kl_in_reward needs beta > 0 (it is the coefficient of the KL penalty)")
    if c.ref_sync_steps and c.beta == 0:
        out.append("ref_sync_steps > 0 needs beta > 0: with beta = 0 there is no reference to sync")
    return out


def _sampling_problems(c: TrainerConfig) -> list[str]:
    out = []
    if c.temperature <= 0 and c.rollout_mode == "sample":
        out.append(f"temperature={c.temperature}: greedy sampling makes every group G identical completions "
                   "(zero advantage everywhere); use temperature > 0 or rollout_mode=beam")
    if c.lora_rank and c.ref_sync_steps:
        out.append("ref_sync_steps is not available with LoRA: the reference is the adapter-free base model")
    if c.max_trajectory_tokens < c.max_new_tokens:
        out.append(f"max_trajectory_tokens={c.max_trajectory_tokens} must be >= max_new_tokens={c.max_new_tokens}")
    return out


def _scale_out_problems(c: TrainerConfig) -> list[str]:
    from grouprl.trainer.rollout_servers import server_problems

    out = server_problems(c.rollout_servers, c.rollout_server_timeout)
    if c.rollout_engine == "vllm" and c.rollout_dtype in FORMATS and FORMATS.get(c.rollout_dtype).vllm_dtype is None:
        out.append(f"rollout_dtype={c.rollout_dtype} is the built-in engine's (vLLM samples in fp32 or bf16): use "
                   "rollout_engine hf or auto")
    if c.rollout_engine == "vllm" and c.rollout_mode == "beam":
        out.append("rollout_mode=beam needs rollout_engine=hf: the vLLM engine samples groups only")
    if c.rollout_engine == "vllm" and importlib.util.find_spec("vllm") is None:
        from grouprl.rollout.engines import INSTALL

        out.append(f"rollout_engine=vllm needs the vllm package, which is not installed: {INSTALL}")
    if c.rollout_weights_transport != "auto" and c.rollout_weights_transport not in TRANSPORTS:
        out.append(f"rollout_weights_transport={c.rollout_weights_transport!r}: choose auto, "
                   f"{', '.join(TRANSPORTS.names())}")
    return out + _async_problems(c)


def _async_problems(c: TrainerConfig) -> list[str]:
    k = c.max_staleness
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        return [f"max_staleness={k!r} must be a whole number >= 0 (0 = synchronous)"]
    if not k:
        return []
    out = []
    if not getattr(c, "rollout_servers", None):
        out.append(f"max_staleness={k} samples the next batches while the trainer updates, which needs rollout "
                   "servers holding their own copy of the weights: set rollout_servers (a number of servers to "
                   "start here, or host:port of each grouprl serve). The built-in engine samples from the live "
                   "training weights and the in-process vLLM engine shares this process; max_staleness 0 trains "
                   "synchronously with them")
    if c.rollout_is == "none":
        out.append(f"max_staleness={k} trains on batches sampled by older policies: rollout_is must correct them "
                   "(token or sequence: truncated importance sampling against the sampling policy), not none")
    return out


def _trust_region_problems(c: TrainerConfig) -> list[str]:
    out = []
    if ALGORITHMS.get(c.algo).update != "trust-region":
        return out
    if c.mu != 1 or c.minibatch_size is not None:
        out.append(f"algo={c.algo} takes one natural-gradient step per rollout: set mu=1 and leave minibatch_size "
                   "empty")
    if c.gradient_checkpointing:
        out.append(f"gradient_checkpointing is not available with algo={c.algo}: its Fisher-vector products "
                   "differentiate twice through the forward pass")
    return out


def _estimator_problems(c: TrainerConfig) -> list[str]:
    """A scale the estimator does not take (its registry entry lists the ones it does)."""
    if c.advantage_estimator not in ADVANTAGES:
        return []  # named by _registry_problems
    estimator = ADVANTAGES.get(c.advantage_estimator)
    if estimator.scales is None or (c.advantage_scale or estimator.scale) in estimator.scales:
        return []
    return [f"advantage_scale={c.advantage_scale!r}: advantage={c.advantage_estimator} takes "
            f"{' or '.join(estimator.scales)}"]
