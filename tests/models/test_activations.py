"""Norms and MLPs that keep fewer activations: bitwise the same outputs and gradients, less memory
between forward and backward."""

from __future__ import annotations

import copy

import pytest
import torch

from grouprl.models import tiny_causal_lm
from grouprl.models.activations import keep_fewer_activations
from grouprl.run.logs import peak_tensor_bytes as peak_bytes


def qwen2(seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=260, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def llama(seed=0):
    return tiny_causal_lm(seed=seed, hidden_size=64)[0]


def loss_and_grads(model, ids, bf16: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(ids).logits
    loss = torch.log_softmax(logits.float(), -1)[..., 5].mean()
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("make", [llama, qwen2])
@pytest.mark.parametrize("bf16", [False, True])
def test_outputs_and_gradients_are_bitwise_unchanged(make, bf16):
    plain = make().train()
    lean = copy.deepcopy(plain)
    assert keep_fewer_activations(lean) == 2 * 2 + 1 + 2  # two norms per layer, the final norm, an MLP per layer
    ids = torch.randint(4, 250, (3, 17), generator=torch.Generator().manual_seed(1))
    logits_plain, grads_plain = loss_and_grads(plain, ids, bf16)
    logits_lean, grads_lean = loss_and_grads(lean, ids, bf16)
    assert torch.equal(logits_plain, logits_lean)
    for name, g in grads_plain.items():
        assert torch.equal(g, grads_lean[name]), name


def test_changed_once_and_state_dict_untouched():
    model = llama()
    keys = list(model.state_dict())
    assert keep_fewer_activations(model) == 7
    assert keep_fewer_activations(model) == 0
    assert list(model.state_dict()) == keys
    copied = copy.deepcopy(model)  # a critic or a reference copied from the policy
    assert keep_fewer_activations(copied) == 0
    assert all(m.forward.__self__ is m for m in copied.modules() if "forward" in vars(m))


def test_less_is_kept_between_forward_and_backward():
    plain = tiny_causal_lm(seed=0, hidden_size=256, num_layers=3)[0].train()
    lean = copy.deepcopy(plain)
    keep_fewer_activations(lean)
    ids = torch.randint(4, 250, (4, 64), generator=torch.Generator().manual_seed(0))

    def step(model):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(ids).logits.float().logsumexp(-1).sum()
        loss.backward()  # the peak: the end of the forward, every activation kept

    peak_plain, _ = peak_bytes(lambda: step(plain))
    peak_lean, _ = peak_bytes(lambda: step(lean))
    tokens, hidden, inter, layers = 4 * 64, 256, 512, 3
    # per token and layer: two norms' float32 outputs and the MLP's bf16 activation
    saved = tokens * layers * (2 * hidden * 4 + inter * 2)
    assert peak_plain - peak_lean >= 0.9 * saved, (peak_plain, peak_lean, saved)


def test_second_order_products_are_unchanged():
    """TRPO's Fisher-vector products differentiate through the backward pass itself."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    plain = llama().eval()
    lean = copy.deepcopy(plain)
    keep_fewer_activations(lean)
    ids = torch.randint(4, 250, (2, 9), generator=torch.Generator().manual_seed(0))

    def fisher_vector_product(model):
        params = list(model.parameters())
        with sdpa_kernel(SDPBackend.MATH):  # the fused CPU attention kernels have no double backward
            logp = torch.log_softmax(model(ids).logits.float(), -1)
        old = logp.detach()
        kl = (old.exp() * (old - logp)).sum()
        grads = torch.autograd.grad(kl, params, create_graph=True)
        flat = torch.cat([g.reshape(-1) for g in grads])
        return torch.cat([h.reshape(-1) for h in torch.autograd.grad(flat.sum(), params)])

    expected = fisher_vector_product(plain)
    assert expected.abs().max() > 0
    assert torch.equal(fisher_vector_product(lean), expected)
