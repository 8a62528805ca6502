"""Models: loading a policy (:mod:`.loading`), the bundled GGUF carrier (:mod:`.bundled`), LoRA (:mod:`.lora`), the
frozen reference (:mod:`.frozen_reference`), tiny test models (:mod:`.tiny`), a critic's value head
(:mod:`.value_head`), number formats (:mod:`.precision`)."""

from grouprl.errors import ModelLoadError
from grouprl.models.bundled import BUNDLED, bundled_model_folder
from grouprl.models.frozen_reference import make_reference, reference_context
from grouprl.models.loading import context_length, ensure_pad_token, load_policy, resolve_dtype
from grouprl.models.lora import LoraSettings, apply_lora, is_peft, merge_and_save, store_frozen_linears, unwrap_ddp
from grouprl.models.tiny import tiny_causal_lm, tiny_llama_config, tiny_tokenizer

__all__ = [
    "BUNDLED", "LoraSettings", "ModelLoadError", "apply_lora", "bundled_model_folder", "context_length",
    "ensure_pad_token", "is_peft", "load_policy", "make_reference", "merge_and_save", "reference_context",
    "resolve_dtype", "store_frozen_linears", "tiny_causal_lm", "tiny_llama_config", "tiny_tokenizer", "unwrap_ddp",
]
