"""Weight casts made again in backward: the same gradients, without a bf16 copy of the weights kept
from forward to backward."""

from __future__ import annotations

import contextlib

import pytest
import torch

from grouprl.models import tiny_causal_lm
from grouprl.models.casts import _cast_source, lean_casts
from grouprl.rollout.logprobs import token_logprobs
from grouprl.run.logs import peak_tensor_bytes as peak_bytes


def batch(seed=0, rows=4, prompt=6, completion=10):
    g = torch.Generator().manual_seed(seed)
    p = torch.randint(4, 200, (rows, prompt), generator=g)
    c = torch.randint(4, 200, (rows, completion), generator=g)
    return p, torch.ones_like(p), c, torch.ones_like(c)


def forward(model, lean: bool):
    with (torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=not lean),
          lean_casts() if lean else contextlib.nullcontext()):
        logp, entropy = token_logprobs(model, *batch(), temperature=0.7, with_entropy=True, chunk_size=7)
    return logp.sum() + 0.1 * entropy.sum()


def grads_and_loss(model, lean: bool):
    model.zero_grad(set_to_none=True)
    loss = forward(model, lean)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_gradients_are_bitwise_those_of_plain_autocast():
    model = tiny_causal_lm(seed=0, hidden_size=128)[0].train()
    loss_plain, plain = grads_and_loss(model, lean=False)
    loss_lean, lean = grads_and_loss(model, lean=True)
    assert loss_lean == loss_plain
    assert plain.keys() == lean.keys()
    for name in plain:
        assert torch.equal(plain[name], lean[name]), name
    assert any(g.abs().sum() > 0 for g in lean.values())


def test_the_bf16_copy_of_the_weights_is_not_kept_until_backward():
    model = tiny_causal_lm(seed=0, hidden_size=256, num_layers=3)[0].train()
    weights_bf16 = sum(p.numel() * 2 for p in model.parameters())
    graphs = []  # each forward's graph stays alive, as it does until its backward
    peak_plain, _ = peak_bytes(lambda: graphs.append(forward(model, lean=False)))
    peak_lean, _ = peak_bytes(lambda: graphs.append(forward(model, lean=True)))
    # all but about one weight's cast (the tied head's, the largest, while the head runs)
    assert peak_plain - peak_lean > 0.6 * weights_bf16, (peak_plain, peak_lean, weights_bf16)
    for loss in graphs:  # and both still train
        loss.backward()


def test_what_counts_as_a_weight_cast():
    w = torch.nn.Parameter(torch.randn(6, 4))
    frozen = torch.randn(6, 4)
    cast = w.to(torch.bfloat16)
    assert _cast_source(cast) is w
    assert _cast_source(cast.t()) is w  # a linear saves the transpose of its weight's cast
    assert _cast_source((w * 2).to(torch.bfloat16)) is None  # a cast of an activation is kept as it is
    assert _cast_source(frozen.to(torch.bfloat16)) is None  # no trace back to a trainable weight
    assert _cast_source(w[:3].to(torch.bfloat16)) is None
    assert _cast_source(w.double()) is None  # only casts down from float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_saved_view_comes_back_with_its_values(dtype):
    w = torch.nn.Parameter(torch.randn(5, 3))
    x = torch.randn(2, 5, requires_grad=True)
    with lean_casts():
        y = (x.to(dtype) @ w.to(dtype)).float().sum()  # mm saves both operands: x's cast and w's
    y.backward()
    assert torch.equal(w.grad, (x.to(dtype).t().float() @ torch.ones(2, 3, dtype=dtype).float()).to(dtype).float())


def test_a_tensor_cast_alike_for_several_products_is_kept_once():
    torch.manual_seed(0)
    q, k, v = (torch.nn.Linear(256, 256, bias=False) for _ in range(3))
    x0 = torch.randn(512, 256)

    def run(lean: bool):
        for m in (q, k, v):
            m.weight.grad = None
        x = x0.clone().requires_grad_()
        with (torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=not lean),
              lean_casts() if lean else contextlib.nullcontext()):
            h = torch.nn.functional.layer_norm(x, (256,))  # fp32 under autocast: each product casts it
            out = (q(h) * k(h)).float().sum() + v(h).float().pow(2).sum()
        out.backward()
        return x.grad, [m.weight.grad.clone() for m in (q, k, v)]

    plain, lean = run(False), run(True)
    assert torch.equal(plain[0], lean[0])
    assert all(torch.equal(a, b) for a, b in zip(plain[1], lean[1]))
    peak_plain, _ = peak_bytes(lambda: run(False))
    peak_lean, _ = peak_bytes(lambda: run(True))
    h_bf16, weights_bf16 = 512 * 256 * 2, 3 * 256 * 256 * 2
    assert peak_plain - peak_lean >= 2 * h_bf16 + weights_bf16 // 2, (peak_plain, peak_lean)
