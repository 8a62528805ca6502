"""Tiny models and a character-level tokenizer for the rollout tests (built locally, no downloads)."""

from __future__ import annotations

import string

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD, EOS = "<pad>", "<eos>"
# Multi-character tokens the model can emit (encoding never produces them), so stop strings can
# end inside a token and span tokens of different lengths.
MULTI = ["ab", "END", "\n\n", "xyz"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def make_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer: <pad>=0, <eos>=1, printable ASCII and newline, then MULTI."""
    chars = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
    vocab = {tok: i for i, tok in enumerate([PAD, EOS, *chars, *MULTI])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=PAD, eos_token=EOS)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0, init_range: float = 0.1,
               head_scale: float = 1.0) -> LlamaForCausalLM:
    """A 2-layer Llama over ``tokenizer``'s vocabulary; ``head_scale`` sharpens its distributions."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=len(tokenizer), max_position_embeddings=512, initializer_range=init_range,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def encode(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> list[list[int]]:
    """Plain-text prompts to token ids (no template)."""
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


PROMPTS = ["What is 7+5?", "Hi", "Count: 1, 2, 3,", "The quick brown fox jumps"]


def assert_thread_count_can_change() -> None:
    """torch.set_num_threads still changes the thread count (and the count is put back)."""
    import torch

    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    try:
        torch.set_num_threads(other)
        assert torch.get_num_threads() == other
    finally:
        torch.set_num_threads(before)
