"""vLLM as the rollout engine, behind the same ``generate`` interface as
:class:`~grouprl.rollout.sampler.Sampler`, colocated with the trainer on each GPU.

- The engine is built from the policy's config and tokenizer with dummy weights (nothing is read
  from disk or downloaded), and receives the trainer's weights before its first rollout and again
  before the first rollout after every optimizer step (:meth:`VLLMSampler.track` hooks the
  optimizer; FSDP shards are gathered one tensor at a time).
- LoRA: the base weights are pushed, and after each optimizer step only the adapter, saved to a
  folder and handed to vLLM as a new LoRA request.
- Sleep mode: between rollouts the engine sleeps at level 1 (KV cache freed, weights parked in
  CPU memory), so training gets the GPU memory back; ``gpu_memory_utilization`` bounds what the
  engine takes while awake. Level 1 rather than 2 because the weights then survive a sleep: a
  push is needed only after an optimizer step, never merely because the engine slept, which keeps
  pushes (collectives under FSDP) at points every process reaches together.
- Sampling settings map one to one (:func:`vllm_sampling_kwargs`). The log-probs are vLLM's
  *processed* ones, under the distribution actually sampled from (after temperature and the
  filters), as the engine's own ``sampling_logprobs`` are: what the truncated importance-sampling
  correction (``rollout_is``) compares with the trainer's. Beam groups are not offered.
- Several processes: each runs its own engine (tensor parallel 1) on its GPU through vLLM's
  external-launcher executor; request seeds mix in the process rank.

``vllm`` is imported only when a :class:`VLLMSampler` is made; without a CUDA GPU or without the
package, making one fails with a message saying which is missing. Known pitfalls this follows:
the engine must run in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) for weights to be loaded by
reference; the prefix cache must be reset after a weight push, or cached prompts keep the old
weights' keys and values; under several processes a weight push is a collective, so the
trainer runs each rollout or evaluation inside :meth:`VLLMSampler.phase` (one push at its start,
one sleep at its end) instead of letting each ``generate`` call decide.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from grouprl.rollout.runner import left_pad
from grouprl.rollout.stops import cut_at_stop
from grouprl.types import RolloutBatch, SamplingParams


def require_vllm() -> Any:
    """The ``vllm`` module, or a clear error naming what this machine lacks."""
    if not torch.cuda.is_available():
        raise RuntimeError("rollout_engine=vllm needs a CUDA GPU and this machine has none; use rollout_engine=hf "
                           "(the built-in sampler runs anywhere)")
    try:
        import vllm
    except ImportError as e:
        raise RuntimeError("rollout_engine=vllm needs the vllm package: pip install vllm (pick the vllm release "
                           "built for this machine's torch and CUDA), or use rollout_engine=hf") from e
    return vllm


def _mix(*parts: int) -> int:
    out = 0
    for p in parts:
        out = (out * 1_000_003 + int(p)) % (2**31)
    return out


def vllm_sampling_kwargs(params: SamplingParams, group_size: int, stop_token_ids: Sequence[int],
                         seed: int | None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` drawing ``group_size`` completions as ``params`` says."""
    if params.mode != "sample":
        raise ValueError(f"the vLLM engine draws sampled groups only, not mode={params.mode!r}; use rollout_engine=hf")
    return {
        "n": group_size, "temperature": params.temperature, "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,  # vLLM spells "off" as -1
        "min_p": params.min_p, "repetition_penalty": params.repetition_penalty, "max_tokens": params.max_new_tokens,
        "stop_token_ids": sorted(set(stop_token_ids)), "stop": list(params.stop_strings) or None,
        "include_stop_str_in_output": True, "logprobs": 0, "seed": seed,
    }


def outputs_to_batch(outputs: Sequence[Any], prompt_ids: list[list[int]], group_size: int, tokenizer: Any,
                     pad_id: int, stop_strings: tuple[str, ...], prompts: list | None = None,
                     extras: dict[str, list] | None = None) -> RolloutBatch:
    """A prompt-major :class:`~grouprl.types.RolloutBatch` from vLLM ``RequestOutput`` s (one per
    prompt, each with ``group_size`` completions carrying ``token_ids``, ``logprobs`` (one
    ``{token_id: Logprob}`` per token) and ``finish_reason``). Texts are decoded and cut at stop
    strings exactly as the built-in sampler does, so reward functions see the same strings."""
    tokens, logps, truncated = [], [], []
    for p, out in enumerate(outputs):
        if len(out.outputs) != group_size:
            raise ValueError(f"vLLM returned {len(out.outputs)} completions for prompt {p}, expected {group_size}")
        for comp in out.outputs:
            ids = list(comp.token_ids)
            tokens.append(ids)
            logps.append([float(entry[t].logprob) for entry, t in zip(comp.logprobs, ids)])
            truncated.append(comp.finish_reason == "length")
    width = max(1, max(len(t) for t in tokens))
    ids = torch.full((len(tokens), width), pad_id, dtype=torch.long)  # [B, T]
    lp = torch.zeros(len(tokens), width)
    for i, (t, lps) in enumerate(zip(tokens, logps)):
        ids[i, : len(t)] = torch.tensor(t, dtype=torch.long)
        lp[i, : len(t)] = torch.tensor(lps)
    lengths = torch.tensor([len(t) for t in tokens])
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).float()  # [B, T]
    texts = tokenizer.batch_decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    if stop_strings:
        texts = [cut_at_stop(t, stop_strings)[0] for t in texts]
    p_ids, p_mask = left_pad([list(map(int, r)) for r in prompt_ids], pad_id, torch.device("cpu"))
    if prompts is None:
        prompts = tokenizer.batch_decode([list(r) for r in prompt_ids], skip_special_tokens=False)
    g = group_size
    return RolloutBatch(
        prompt_ids=p_ids.repeat_interleave(g, 0), prompt_mask=p_mask.repeat_interleave(g, 0), completion_ids=ids,
        completion_mask=mask, sampling_logprobs=lp, truncated=torch.tensor(truncated), completions=texts,
        prompts=[x for x in prompts for _ in range(g)], group_size=g, pad_token_id=pad_id,
        extras={k: [v for v in col for _ in range(g)] for k, col in (extras or {}).items()},
    )


def base_weight_name(name: str) -> str | None:
    """A peft LoRA model's parameter name as the plain model calls it; None for adapter weights."""
    if ".lora_" in name:
        return None
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def _plain_class_name(model: nn.Module) -> str:
    """The ``transformers`` class of ``model`` (FSDP2 subclasses modules in place)."""
    from torch.distributed.fsdp import FSDPModule

    return next(c.__name__ for c in type(model).__mro__ if not issubclass(c, FSDPModule))


def full_tensors(model: nn.Module, device: torch.device,
                 keep: Any = lambda name: True) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of the entries of ``model``'s state dict whose name ``keep`` accepts,
    gathering FSDP shards one tensor at a time (a collective: every process iterates alike)."""
    from torch.distributed.tensor import DTensor

    for name, t in model.state_dict().items():
        if not keep(name):
            continue
        if isinstance(t, DTensor):
            t = t.to(device).full_tensor()
        yield name, t.detach()


class VLLMSampler:
    """G completions per prompt from a colocated vLLM engine that follows the trainer's weights.

    Args:
        model: the policy being trained (plain, peft LoRA, or FSDP-sharded; not a DDP wrapper).
        tokenizer: its tokenizer.
        max_model_len: longest prompt + completion, in tokens.
        gpu_memory_utilization: share of the GPU the engine may take while awake.
        sleep: sleep between rollouts, giving the memory back to training (after each ``generate``
            call, or at the end of each :meth:`phase`).
        seed: engine seed (the process rank is mixed in).
        lora_rank: the adapters' rank when ``model`` is a peft LoRA model (pushes adapters only).
        dtype: the engine's compute dtype.
    """

    uses_live_model = False
    """The trainer need not gather its own weights for a rollout: the engine holds a copy."""

    def __init__(self, model: nn.Module, tokenizer: Any, *, max_model_len: int, gpu_memory_utilization: float = 0.3,
                 sleep: bool = True, seed: int = 0, lora_rank: int | None = None, dtype: str = "bfloat16"):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # weights by reference, not pickled
        vllm = require_vllm()
        self.model, self.tokenizer = model, tokenizer
        self.rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.sleep_between = sleep
        self.lora = lora_rank is not None and hasattr(model, "peft_config")
        self.folder = tempfile.mkdtemp(prefix="grouprl-vllm-")
        self._write_model_files()
        kwargs: dict[str, Any] = dict(
            model=self.folder, tokenizer=self.folder, load_format="dummy", dtype=dtype, seed=_mix(seed, self.rank),
            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len, enable_sleep_mode=sleep,
            logprobs_mode="processed_logprobs", enable_prefix_caching=True)
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            kwargs["distributed_executor_backend"] = "external_launcher"  # one engine per torchrun process
        if self.lora:  # vLLM takes a few fixed maximum ranks: the next power of two, at least 8
            kwargs.update(enable_lora=True, max_lora_rank=max(8, 1 << (int(lora_rank) - 1).bit_length()), max_loras=1)
        try:
            self.llm = vllm.LLM(**kwargs)
        except TypeError as e:
            raise RuntimeError(f"this vllm release does not take {e}; rollout_engine=vllm needs vllm >= 0.10.2 "
                               "(processed log-probs, sleep mode with tags)") from e
        self.awake, self.stale, self.base_loaded, self.adapter_version = True, True, False, 0
        self.in_phase = False
        self.lora_request: Any = None

    def _write_model_files(self) -> None:
        inner = self.model.get_base_model() if self.lora else self.model
        config = inner.config.__class__.from_dict(inner.config.to_dict())
        config.architectures = [_plain_class_name(inner)]
        config.save_pretrained(self.folder)
        self.tokenizer.save_pretrained(self.folder)

    # -- weights ----------------------------------------------------------------------------------
    def track(self, optimizer: torch.optim.Optimizer) -> None:
        """Mark the engine's weights stale after every step of ``optimizer``."""
        optimizer.register_step_post_hook(lambda *_: self.mark_stale())

    def mark_stale(self) -> None:
        self.stale = True

    def update_weights(self, model: nn.Module) -> None:
        """Follow ``model`` from now on (pushed before the next rollout)."""
        self.model = model
        self.stale = True

    def _load(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        if hasattr(self.llm, "apply_model"):  # vLLM's public hook into the engine's model
            self.llm.apply_model(lambda m: m.load_weights(weights))
            return
        worker = self.llm.llm_engine.model_executor.driver_worker  # older releases
        getattr(worker, "worker", worker).model_runner.model.load_weights(weights)

    def sync_weights(self) -> None:
        """Push the trainer's weights if they changed since the last push (a collective under FSDP:
        every process calls it at the same point)."""
        if not self.stale:
            return
        self.wake()
        if not self.lora or not self.base_loaded:
            keep = (lambda name: base_weight_name(name) is not None) if self.lora else (lambda name: True)
            for name, tensor in full_tensors(self.model, self.device, keep):
                self._load([(base_weight_name(name) if self.lora else name, tensor.to(self.device))])
            self.base_loaded = True
        if self.lora:
            self._push_adapter()
        self.llm.reset_prefix_cache()  # cached prompt keys/values were computed with the old weights
        self.stale = False

    def _push_adapter(self) -> None:
        from vllm.lora.request import LoRARequest

        state = dict(full_tensors(self.model, self.device, lambda name: ".lora_" in name))
        self.adapter_version += 1
        path = os.path.join(self.folder, f"adapter-{self.adapter_version}")
        self.model.save_pretrained(path, state_dict=state)
        stale = os.path.join(self.folder, f"adapter-{self.adapter_version - 1}")
        shutil.rmtree(stale, ignore_errors=True)
        self.lora_request = LoRARequest(f"grouprl-{self.adapter_version}", self.adapter_version, path)

    # -- memory -----------------------------------------------------------------------------------
    def wake(self) -> None:
        if not self.awake:
            self.llm.wake_up()
            self.awake = True

    def sleep(self) -> None:
        """Free the KV cache and park the weights in CPU memory until the next rollout."""
        if self.awake and self.sleep_between:
            self.llm.sleep(level=1)
            self.awake = False

    @contextlib.contextmanager
    def phase(self) -> Iterator[None]:
        """Several ``generate`` calls (a rollout, an evaluation) between one weight push and one sleep.
        Under several processes every process enters together (the push is a collective)."""
        self.sync_weights()
        self.in_phase = True
        try:
            yield
        finally:
            self.in_phase = False
            self.sleep()

    # -- generation -------------------------------------------------------------------------------
    def stop_token_ids(self, params: SamplingParams) -> list[int]:
        ids = set(params.stop_token_ids)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return sorted(ids)

    def generate(self, prompt_ids: list[list[int]], group_size: int, params: SamplingParams, *,
                 seed: int | None = None, prompts: list | None = None,
                 extras: dict[str, list] | None = None) -> RolloutBatch:
        """G completions for each of P prompts, prompt-major, as :meth:`Sampler.generate`."""
        self.sync_weights()
        self.wake()
        requests = [{"prompt_token_ids": list(map(int, ids))} for ids in prompt_ids]  # vLLM's TokensPrompt
        sampling = [self.vllm.SamplingParams(**vllm_sampling_kwargs(
            params, group_size, self.stop_token_ids(params), None if seed is None else _mix(seed, self.rank, p)))
            for p in range(len(prompt_ids))]
        outputs = self.llm.generate(requests, sampling_params=sampling, use_tqdm=False, lora_request=self.lora_request)
        if not self.in_phase:
            self.sleep()
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        return outputs_to_batch(outputs, prompt_ids, group_size, self.tokenizer, int(pad or 0),
                                tuple(params.stop_strings), prompts, extras).to(self.device)
