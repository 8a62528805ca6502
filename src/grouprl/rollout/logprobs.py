"""Per-token log-probs (and entropies) of given completions under a causal LM. The LM head runs over chunks of
positions (:mod:`.head`), so no float32 ``[B, T, V]`` exists; positions follow the sampler's, so unfiltered samples
score their ``sampling_logprobs``; ``temperature=0`` is scored at 1."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from grouprl.rollout.head import score_chunks
from grouprl.rollout.packing import MASK_FORMS, pack_groups
from grouprl.rollout.runner import positions_from_mask, unwrap_model

CHUNK_ELEMENTS = 1 << 24  # a chunk's float32 logits: 64 MiB


def _head_is_plain(model: nn.Module) -> bool:
    """Whether logits are just ``lm_head(hidden)`` (no soft-capping or scaling after the head)."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is None:
        return False
    if getattr(text, "final_logit_softcapping", None) is not None or getattr(text, "logit_scale", None) is not None:
        return False
    return getattr(text, "logits_scaling", 1.0) in (None, 1.0)


def _prompt_learning(model: nn.Module) -> bool:
    """Whether a peft prompt-learning adapter (prefix or prompt tuning) changes the forward itself."""
    peft_config = getattr(model, "peft_config", None)
    active = getattr(model, "active_adapter", None)
    return isinstance(peft_config, dict) and isinstance(active, str) and active in peft_config \
        and bool(getattr(peft_config[active], "is_prompt_learning", False))


def _attention_implementation(model: nn.Module) -> str | None:
    """The ``transformers`` attention implementation inside DDP and peft wrappers."""
    while isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    inner = unwrap_model(model)
    return getattr(getattr(inner, "config", None), "_attn_implementation", None)


def split_model(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """(decoder body, LM head) of ``model`` (through peft LoRA wrappers), or None where calling them apart is not
    safe: prompt learning changes the forward, and DDP must run its own to synchronise gradients."""
    if _prompt_learning(model):
        return None
    hf = unwrap_model(model)
    if not _head_is_plain(hf) or not hasattr(hf, "get_decoder"):
        return None
    body, head = hf.get_decoder(), hf.get_output_embeddings()
    if body is None or body is hf or head is None:
        return None
    return body, head


def _forward(model: nn.Module, **inputs: torch.Tensor) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """([rows, L, F] hidden states of the decoder body, the LM head) where the model splits, else
    ([rows, L, V] logits of the whole model, the identity)."""
    parts = split_model(model)
    if parts is not None:
        body, head = parts
        return body(**inputs, use_cache=False).last_hidden_state, head
    return model(**inputs, use_cache=False).logits, nn.Identity()


def padded_features(model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                     completion_ids: torch.Tensor, where: torch.Tensor
                     ) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor], int]:
    """Every row as ``[prompt | completion]``: ([n, F] hidden states or logits at the positions that
    predict the ``where`` tokens, the map from F to logits, vocab size)."""
    b, lp = prompt_ids.shape
    t = completion_ids.shape[1]
    ids = torch.cat([prompt_ids, completion_ids], 1)  # [B, Lp + T]
    # Right padding sits after every real token, so causal attention never lets it change a real position.
    attn = torch.cat([prompt_mask.long(), torch.ones_like(completion_ids, dtype=torch.long)], 1)
    feats, head = _forward(model, input_ids=ids, attention_mask=attn, position_ids=positions_from_mask(attn))
    feats = feats[:, lp - 1 : lp + t - 1]  # [B, T, F]: position i predicts completion token i
    return feats.reshape(b * t, -1).index_select(0, where), head, _vocab(head, feats)


def _packed_features(model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                     completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                     sequence_mask: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor], int] | None:
    """:func:`padded_features` in the padding-free layout (:mod:`.packing`); None where the model cannot take it."""
    impl = _attention_implementation(model)
    if impl not in MASK_FORMS or _prompt_learning(model):
        return None
    packed = pack_groups(prompt_ids, prompt_mask, completion_ids, completion_mask, sequence_mask)
    mask = MASK_FORMS.get(impl)(packed.allowed, next(model.parameters()).dtype)
    out, head = _forward(model, input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids)
    feats = out.reshape(-1, out.shape[-1]).index_select(0, packed.predictor)  # [n, F]
    return feats, head, _vocab(head, feats)


def _vocab(head: nn.Module, feats: torch.Tensor) -> int:
    weight = getattr(head, "weight", None)  # [V, H] for a linear head (peft wraps keep .weight)
    return weight.shape[0] if weight is not None else feats.shape[-1]


def token_logprobs(model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                   completion_ids: torch.Tensor, completion_mask: torch.Tensor, temperature: float = 1.0,
                   chunk_size: int | None = None, with_entropy: bool = False, packed: bool = False,
                   sequence_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """prompts [B, Lp] left-padded, completions [B, T] right-padded -> (logp [B, T] float32, entropy or None), 0
    where ``completion_mask`` is 0. ``packed``: the padding-free layout where the model allows it; ``sequence_mask``
    [B, T], a prefix mask, marks a trajectory's tokens (the environment's are attended, not scored)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if prompt_ids.shape != prompt_mask.shape or completion_ids.shape != completion_mask.shape:
        raise ValueError("ids and masks must have the same shapes: "
                         f"{tuple(prompt_ids.shape)} vs {tuple(prompt_mask.shape)}, "
                         f"{tuple(completion_ids.shape)} vs {tuple(completion_mask.shape)}")
    b, t = completion_ids.shape
    where = (completion_mask.reshape(-1) > 0).nonzero().flatten()  # [n] flat positions that count
    found = (_packed_features(model, prompt_ids, prompt_mask, completion_ids, completion_mask, sequence_mask)
             if packed else None)
    feats, head, vocab = found or padded_features(model, prompt_ids, prompt_mask, completion_ids, where)  # [n, F]
    tokens = completion_ids.reshape(-1).index_select(0, where)  # [n]

    size = chunk_size or max(1, CHUNK_ELEMENTS // vocab)
    logp, entropy = score_chunks(head, feats, tokens, temperature or 1.0, with_entropy, size)  # [n], [n]

    def scatter(flat: torch.Tensor) -> torch.Tensor:
        return flat.new_zeros(b * t).index_copy(0, where, flat).view(b, t)

    return scatter(logp), (scatter(entropy) if with_entropy else None)
