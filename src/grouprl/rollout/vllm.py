"""vLLM in the trainer's process as a rollout engine (:class:`~grouprl.rollout.protocol.ConversationEngine`).

On a CPU: eager, a KV cache sized to the run, cache and weights freed between rollouts; on a GPU: CUDA graphs
and sleep mode. Weights start dummy and arrive before the first rollout after each update through vLLM's in-place
reload (the CPU build repacks weights, so ``model.load_weights`` fails); with LoRA the base goes once, then each
adapter as a new LoRA request. One request per row with its own seed, so a completion does not depend on the
batch; log-probs are vLLM's processed ones (the distribution sampled from)."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from grouprl.rollout.engines import plain_class_name, require_vllm
from grouprl.rollout.process_state import kept_process_state
from grouprl.rollout.scratch import ScratchFolder
from grouprl.rollout.seeds import resolve_row_seeds
from grouprl.rollout.stops import pad_id, stop_token_ids
from grouprl.rollout.turns import Conversations, Reply, TurnLimits
from grouprl.rollout.vllm_convert import outputs_to_batch, play_conversations, vllm_sampling_kwargs
from grouprl.rollout.vllm_weights import (
    base_weight_name,
    engine_parameters,
    free_kv_cache,
    free_weights,
    full_tensors,
    resolves_lora_wrappers,
    restore_kv_cache,
    restore_weights,
    wrapped_weight_name,
)
from grouprl.types import RolloutBatch, SamplingParams

KV_HEADROOM = 1.25  # vLLM rounds every request up to blocks of tokens
MIN_KV_BYTES = 64 * 2**20


def kv_cache_bytes(model: nn.Module, rows: int, max_model_len: int, dtype: torch.dtype) -> int:
    """Bytes of a KV cache for ``rows`` sequences of ``max_model_len`` tokens in ``dtype``, with headroom.

    >>> from grouprl.models import tiny_causal_lm
    >>> m = tiny_causal_lm(seed=0)[0]  # 2 layers, 2 key/value heads of 16: 2 * 2 * 2 * 16 * 2 = 256 B a token
    >>> kv_cache_bytes(m, 2**12, 64, torch.bfloat16) == int(256 * 2**12 * 64 * KV_HEADROOM)
    True
    """
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()
    return max(MIN_KV_BYTES, int(per_token * rows * max_model_len * KV_HEADROOM))



class VLLMSampler:
    """Completions (or agents' conversations) from a colocated vLLM engine that follows the trainer's weights
    (``model`` plain, LoRA or FSDP-sharded; not DDP). ``kv_cache_gib`` None sizes the CPU cache for ``max_rows``."""

    uses_live_model = False
    compiles = False
    _sleeper: weakref.ref[VLLMSampler] | None = None
    """The engine of this process that holds vLLM's sleep-mode allocator."""

    def __init__(self, model: nn.Module, tokenizer: Any, *, max_model_len: int, dtype: str = "float32", seed: int = 0,
                 lora_rank: int | None = None, gpu_memory_utilization: float = 0.3, sleep: bool = True,
                 kv_cache_gib: float | None = None, max_rows: int = 64, compiled: bool = False):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # weights by reference, not pickled
        on_gpu = torch.cuda.is_available()
        self.vllm = require_vllm()
        self.model, self.tokenizer = model, tokenizer
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype)
        self.lora = lora_rank is not None and hasattr(model, "peft_config")
        if on_gpu and self.lora and self.dtype == torch.float32:
            raise ValueError("vLLM's GPU LoRA kernels take bf16 or fp16 adapters and this engine would run in "
                             "fp32: set dtype: bf16 (or auto, bf16 on a GPU), or rollout_engine: hf")
        self.device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        self.sleep_between = sleep and on_gpu  # the CPU build has no sleep mode
        if self.sleep_between and VLLMSampler._sleeper is not None and VLLMSampler._sleeper() is not None:
            warnings.warn("a second vLLM engine in this process starts without sleep mode: vLLM's sleep-mode "
                          "allocator serves one engine per process", stacklevel=2)
            self.sleep_between = False
        self.scratch = ScratchFolder("grouprl-vllm-")
        self.folder = str(self.scratch.path)
        inner = model.get_base_model() if self.lora else model
        config = inner.config.__class__.from_dict(inner.config.to_dict())
        config.architectures = [plain_class_name(inner)]
        config.save_pretrained(self.folder)
        tokenizer.save_pretrained(self.folder)
        kwargs: dict[str, Any] = dict(
            model=self.folder, tokenizer=self.folder, load_format="dummy", dtype=dtype, seed=seed,
            max_model_len=max_model_len, logprobs_mode="processed_logprobs", enable_prefix_caching=True)
        if on_gpu:
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=self.sleep_between)
        else:
            # a chunked prefill makes vLLM rewind the request's seeded generator, which a CPU one cannot
            kv = int(kv_cache_gib * 2**30) if kv_cache_gib else kv_cache_bytes(inner, max_rows, max_model_len,
                                                                                self.dtype or torch.float32)
            kwargs.update(enforce_eager=not compiled, enable_chunked_prefill=False,
                          max_num_batched_tokens=max(max_model_len, 8192), kv_cache_memory_bytes=kv)
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            kwargs["distributed_executor_backend"] = "external_launcher"  # one engine per torchrun process
        if self.lora:  # vLLM takes a few fixed maximum ranks: the next power of two, at least 8
            kwargs.update(enable_lora=True, max_lora_rank=max(8, 1 << (int(lora_rank) - 1).bit_length()), max_loras=1)
        with kept_process_state():
            self.llm = self.vllm.LLM(**kwargs)
        if self.sleep_between:
            VLLMSampler._sleeper = weakref.ref(self)
        self.awake, self.stale, self.base_loaded, self.adapter_version = True, True, False, 0
        self.in_phase = False
        self.lora_request: Any = None
        self.can_rest = not on_gpu and not compiled  # see rest()
        self.freed: dict[str, int] | None = None  # while resting: each parameter's bytes
        self.freed_cache: list[int] | None = None  # while resting: the KV cache's bytes
        # a LoRA engine's parameter names and packed modules, for a vLLM that loads base weights only under them
        self.engine_names: tuple[set[str], dict[str, list[str]]] = (set(), {})
        if self.lora and not resolves_lora_wrappers():
            ((params, packed),) = self.llm.collective_rpc(engine_parameters)
            self.engine_names = (set(params), packed)
        self.push_seconds = 0.0

    # -- weights ----------------------------------------------------------------------------------
    def update_weights(self, model: nn.Module) -> None:
        self.model = model
        self.stale = True

    def sync_weights(self) -> None:
        """Push the trainer's weights if they changed (under FSDP a collective: every process calls it)."""
        if self.freed_cache is not None:  # given back zeroed: nothing the prefix cache pointed to is there
            self.llm.collective_rpc(restore_kv_cache, kwargs={"sizes": self.freed_cache})
            self.freed_cache = None
            self.llm.reset_prefix_cache()
        if not self.stale:
            return
        start = time.perf_counter()
        self.wake()
        if self.freed is not None:
            self.llm.collective_rpc(restore_weights, kwargs={"sizes": self.freed})
            self.freed = None
        if not self.lora or not self.base_loaded:
            if self.lora:
                weights = ((wrapped_weight_name(base_weight_name(n), *self.engine_names), t)
                           for n, t in full_tensors(self.model, self.device, lambda n: base_weight_name(n) is not None))
            else:
                weights = full_tensors(self.model, self.device)
            # in the engine's format: a bf16 engine gets half the bytes, and vLLM warns of every fp32 tensor
            cast = ((n, t.to(self.dtype) if self.dtype and t.is_floating_point() else t) for n, t in weights)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": cast})
            self.base_loaded = True
        if self.lora:
            self._push_adapter()
        self.llm.reset_prefix_cache()  # cached prompt keys/values were computed with the old weights
        self.stale = False
        self.push_seconds += time.perf_counter() - start

    def _push_adapter(self) -> None:
        from vllm.lora.request import LoRARequest

        state = dict(full_tensors(self.model, self.device, lambda name: ".lora_" in name))
        self.adapter_version += 1
        path = os.path.join(self.folder, f"adapter-{self.adapter_version}")
        self.model.save_pretrained(path, state_dict=state)
        shutil.rmtree(os.path.join(self.folder, f"adapter-{self.adapter_version - 1}"), ignore_errors=True)
        self.lora_request = LoRARequest(f"grouprl-{self.adapter_version}", self.adapter_version, path)

    def close(self) -> None:
        """Remove the engine's folder; release vLLM's process groups before the run's own."""
        self.scratch.remove()
        if torch.distributed.is_initialized():
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            destroy_distributed_environment()  # vLLM's groups, then the run's own

    def cancel(self) -> None:
        """Nothing to cancel: a generation runs in the caller's thread."""

    def sample_ahead(self) -> None:
        return None

    def metrics(self) -> dict[str, float]:
        """``time/weight_push`` since the last call."""
        out, self.push_seconds = {"time/weight_push": self.push_seconds}, 0.0
        return out

    # -- memory -----------------------------------------------------------------------------------
    def wake(self) -> None:
        if not self.awake:
            self.llm.wake_up()
            self.awake = True

    def sleep(self) -> None:
        """Free the KV cache and park the weights in CPU memory until the next rollout (GPU only)."""
        if self.awake and self.sleep_between:
            self.llm.sleep(level=1)
            self.awake = False

    def rest(self) -> None:
        """A CPU engine frees its KV cache and, unless LoRA or compiled, its weights until the next generation."""
        if not self.can_rest or self.freed_cache is not None:
            return
        (self.freed_cache,) = self.llm.collective_rpc(free_kv_cache)
        if not self.lora:
            (self.freed,) = self.llm.collective_rpc(free_weights)
            self.stale = True

    @property
    def resting(self) -> bool:
        return self.freed_cache is not None

    @contextlib.contextmanager
    def phase(self) -> Iterator[None]:
        self.sync_weights()
        self.in_phase = True
        try:
            yield
        finally:
            self.in_phase = False
            self.sleep()

    # -- generation -------------------------------------------------------------------------------
    def _complete(self, sequences: list[list[int]], kwargs: list[dict[str, Any]]) -> list[Any]:

        self.sync_weights()
        self.wake()
        requests = [{"prompt_token_ids": list(map(int, s))} for s in sequences]  # vLLM's TokensPrompt
        outputs = self.llm.generate(requests, sampling_params=[self.vllm.SamplingParams(**k) for k in kwargs],
                                    use_tqdm=False, lora_request=self.lora_request)
        if not self.in_phase:
            self.sleep()
        return [out.outputs[0] for out in outputs]

    def generate(self, prompt_ids: list[list[int]], group_size: int, params: SamplingParams, *,
                 seed: int | Sequence[int] | None = None, prompts: list | None = None,
                 extras: dict[str, list] | None = None) -> RolloutBatch:
        """As :meth:`Sampler.generate`."""
        seeds = resolve_row_seeds(seed, len(prompt_ids) * group_size)
        stop = stop_token_ids(self.tokenizer, params)
        rows = [ids for ids in prompt_ids for _ in range(group_size)]
        completions = self._complete(rows, [vllm_sampling_kwargs(params, stop, s) for s in seeds])
        return outputs_to_batch(completions, prompt_ids, group_size, self.tokenizer, pad_id(self.tokenizer),
                                tuple(params.stop_strings), prompts, extras)

    def conversations(self, prompt_rows: list[list[int]], group_size: int, params: SamplingParams,
                      limits: TurnLimits, respond: Callable[[list[int], list[list[int]], list[bool]], list[Reply]],
                      seeds: list[int], stop_ids: list[int]) -> Conversations:
        """As :func:`grouprl.rollout.turns.decode_conversations`."""
        return play_conversations(prompt_rows, group_size, params, limits, respond, seeds, stop_ids,
                                  lambda rows, sequences, kwargs: self._complete(sequences, kwargs))

