"""A LoRA model's frozen linear weights stored in bf16 for bf16 training: the same products as autocast's
casts of fp32 weights, half the held memory, no casts kept for backward, and merging in the model's own
format."""

from __future__ import annotations

import copy

import torch

from grouprl.models import LoraSettings, apply_lora, merge_and_save, store_frozen_linears, tiny_causal_lm
from grouprl.models.casts import lean_casts
from grouprl.rollout.logprobs import token_logprobs
from grouprl.run.logs import peak_tensor_bytes

TARGETS = ("q_proj", "v_proj", "gate_proj")


def lora_model(seed=0):
    torch.manual_seed(seed)
    model = apply_lora(tiny_causal_lm(seed=seed, hidden_size=128)[0], LoraSettings(rank=4, target_modules=TARGETS))
    with torch.no_grad():  # adapters that change the products (B starts at zero)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model.train()


def batch(seed=0, rows=4, prompt=6, completion=10):
    g = torch.Generator().manual_seed(seed)
    p = torch.randint(4, 200, (rows, prompt), generator=g)
    c = torch.randint(4, 200, (rows, completion), generator=g)
    return p, torch.ones_like(p), c, torch.ones_like(c)


def loss_and_grads(model):
    """The trainer's bf16 training pass (autocast without its cache, weight casts made again in backward)."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False), lean_casts():
        logp, _ = token_logprobs(model, *batch(), temperature=0.7)
    loss = logp.sum()
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def frozen_linear_weights(model):
    return [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear) and not m.weight.requires_grad]


def test_only_frozen_linear_weights_not_shared_with_other_modules_change_format():
    model = lora_model()
    embedding = model.get_input_embeddings().weight
    frozen = [w for w in frozen_linear_weights(model) if w is not embedding]  # the tied head is the embedding
    assert store_frozen_linears(model, torch.bfloat16) == len(frozen) > 0
    assert all(w.dtype == torch.bfloat16 for w in frozen)
    assert embedding.dtype == torch.float32  # looked up outside autocast: the residual stream stays fp32
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)  # adapters
    assert all(m.weight.dtype == torch.float32 for m in model.modules() if isinstance(m, torch.nn.LayerNorm)
               or type(m).__name__.endswith("RMSNorm"))
    assert store_frozen_linears(model, torch.bfloat16) == 0  # nothing left to convert


def test_a_bf16_base_gives_bitwise_the_losses_and_adapter_gradients_of_autocast_on_fp32():
    fp32 = lora_model()
    bf16 = copy.deepcopy(fp32)
    store_frozen_linears(bf16, torch.bfloat16)
    loss_a, grads_a = loss_and_grads(fp32)
    loss_b, grads_b = loss_and_grads(bf16)
    assert loss_a == loss_b
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == 2 * len(TARGETS) * 2
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name


def test_a_bf16_base_keeps_no_weight_casts_for_backward():
    fp32 = lora_model()
    bf16 = copy.deepcopy(fp32)
    store_frozen_linears(bf16, torch.bfloat16)
    cast_bytes = sum(w.numel() * 2 for w in frozen_linear_weights(bf16) if w.dtype == torch.bfloat16)
    peak_fp32, _ = peak_tensor_bytes(lambda: loss_and_grads(fp32))
    peak_bf16, _ = peak_tensor_bytes(lambda: loss_and_grads(bf16))
    # autocast's bf16 casts of the frozen fp32 weights, saved from each forward to its backward, are gone
    assert peak_fp32 - peak_bf16 >= 0.9 * cast_bytes


def test_merging_a_bf16_base_adds_the_adapters_in_the_models_own_format(tmp_path):
    model = lora_model()
    with torch.no_grad():  # updates too small for bf16 weights to hold
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(1e-3)
    store_frozen_linears(model, torch.bfloat16)
    want = copy.deepcopy(model)
    for w in frozen_linear_weights(want):
        w.data = w.data.float()
    want = want.merge_and_unload().state_dict()
    from transformers import AutoModelForCausalLM

    merge_and_save(model, tiny_causal_lm()[1], tmp_path / "merged")
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).state_dict()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert got[q].dtype == torch.float32 and torch.equal(got[q], want[q])
    base = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert not torch.equal(got[q].to(torch.bfloat16).float(), got[q])  # the update is below bf16's resolution
    assert not torch.equal(got[q], base.float())
    assert store_frozen_linears(model, torch.bfloat16) == 0  # the model itself keeps training as it was


def test_converting_lets_go_of_the_file_the_model_was_mapped_from(tmp_path):
    from transformers import AutoModelForCausalLM

    model, tok = tiny_causal_lm(seed=0, hidden_size=128)
    model.save_pretrained(tmp_path / "m")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32)
    lora = apply_lora(loaded, LoraSettings(rank=4, target_modules=TARGETS))
    del loaded

    def mapped():
        return str(tmp_path / "m" / "model.safetensors") in open("/proc/self/maps").read()

    assert mapped()  # transformers maps the weights file: its pages count as the process's memory
    store_frozen_linears(lora, torch.bfloat16)
    assert not mapped()
