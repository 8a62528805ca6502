"""PPO's critic for language models: a scalar value head on a copy of the policy's decoder or on a smaller model
reading the same ids; position t's value is read from the hidden state that predicts token t."""

from __future__ import annotations

import copy

import torch
from torch import nn

from grouprl.rollout.logprobs import split_model
from grouprl.rollout.runner import positions_from_mask


class ValueModel(nn.Module):
    """``V(prompt, completion[:t])`` for every completion position: ids ``[B, Lp]`` + ``[B, T]`` -> ``[B, T]``."""

    def __init__(self, body: nn.Module, hidden_size: int):
        super().__init__()
        self.body = body
        self.head = nn.Linear(hidden_size, 1)
        # Start at V = 0: the first advantages are then the plain (KL-shaped) returns.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                completion_mask: torch.Tensor) -> torch.Tensor:
        """Values ``[B, T]`` float32, 0 off ``completion_mask``; prompts left-padded, completions right-padded."""
        lp, t = prompt_ids.shape[1], completion_ids.shape[1]
        ids = torch.cat([prompt_ids, completion_ids], 1)  # [B, Lp + T]
        attn = torch.cat([prompt_mask.long(), torch.ones_like(completion_ids, dtype=torch.long)], 1)
        hidden = self.body(input_ids=ids, attention_mask=attn, position_ids=positions_from_mask(attn),
                           use_cache=False).last_hidden_state  # [B, Lp + T, H]
        state = hidden[:, lp - 1: lp + t - 1]  # [B, T, H]: position i is the state before completion token i
        return self.head(state.to(self.head.weight.dtype)).squeeze(-1).float() * completion_mask


def make_critic(policy: nn.Module, backbone: nn.Module | None = None) -> ValueModel:
    """A :class:`ValueModel` on a copy of ``policy``'s decoder, or on ``backbone``'s (not copied), which must have a
    separable decoder and read the policy's token ids."""
    source = policy if backbone is None else backbone
    parts = split_model(source)
    if parts is None:
        raise ValueError("the critic needs a model whose decoder body can be called on its own "
                         "(get_decoder() and a plain LM head); this one has none")
    body = parts[0]
    if backbone is None:
        body = copy.deepcopy(body)
    else:
        body.requires_grad_(True)
        mine = _vocab_size(parts[0])
        theirs = _vocab_size(split_model(policy)[0]) if split_model(policy) is not None else None
        if mine is not None and theirs is not None and mine < theirs:
            raise ValueError(f"the critic model's vocabulary ({mine} tokens) is smaller than the policy's "
                             f"({theirs}): it must read the policy's token ids; use a model with the same tokenizer")
    return ValueModel(body, body.config.hidden_size)


def _vocab_size(body: nn.Module) -> int | None:
    embed = body.get_input_embeddings() if hasattr(body, "get_input_embeddings") else None
    return None if embed is None else int(embed.weight.shape[0])
