"""Tiny models for tests and smoke runs: a byte-level tokenizer and a random 2-layer Llama, built in memory."""

from __future__ import annotations

from typing import Any

import torch

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""The ChatML format SmolLM2 uses, without its default system prompt."""

TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")


def tiny_tokenizer() -> Any:
    """A byte-level tokenizer: 4 special tokens (ids 0-3: ``<|endoftext|>`` BOS/UNK, ``<|im_start|>``,
    ``<|im_end|>`` EOS, ``<|pad|>``) and one per byte (ids 4-259), with a ChatML template. Any text round-trips.

    >>> tok = tiny_tokenizer()
    >>> ids = tok("2+3=5")["input_ids"]
    >>> len(ids), tok.decode(ids), tok.eos_token_id, tok.pad_token_id
    (5, '2+3=5', 2, 3)
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate([*TINY_SPECIAL_TOKENS, *byte_chars])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=TINY_SPECIAL_TOKENS[0]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(TINY_SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|endoftext|>", unk_token="<|endoftext|>", eos_token="<|im_end|>",
        pad_token="<|pad|>", chat_template=CHATML_TEMPLATE,
    )


def tiny_llama_config(tokenizer: Any, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                      num_kv_heads: int = 2, intermediate_size: int | None = None, max_positions: int = 512,
                      tie_word_embeddings: bool = True, **overrides: Any) -> Any:
    """A small ``LlamaConfig`` whose vocabulary and special ids match ``tokenizer``."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size or 2 * hidden_size, max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=tie_word_embeddings, **overrides,
    )


def tiny_causal_lm(seed: int = 0, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                   num_kv_heads: int = 2, intermediate_size: int | None = None, max_positions: int = 512,
                   tokenizer: Any = None, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, Any]:
    """(LlamaForCausalLM, tokenizer) with random weights from ``seed``; :func:`tiny_tokenizer` unless given one."""
    from transformers import LlamaForCausalLM

    tokenizer = tokenizer if tokenizer is not None else tiny_tokenizer()
    config = tiny_llama_config(tokenizer, hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size,
                               max_positions)
    with torch.random.fork_rng(devices=[]):  # seeded without disturbing the caller's global RNG
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval(), tokenizer
