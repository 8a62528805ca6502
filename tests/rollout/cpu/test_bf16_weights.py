"""bf16-weights decode steps: the packed copy is torch's bf16 rounding laid out in panels, the native product
equals fp32 sums over the rounded weights (every row count and panel grouping, one thread or several, row by
row or all at once), only one-token steps use it, and the kernel's build (what the weight-only formats share:
test_weight_only.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from grouprl.rollout.cpu import bf16_weights, native
from grouprl.rollout.cpu.bf16_weights import PANEL, bf16_weights_linear, pack, product, supported
from grouprl.rollout.cpu.weight_only import BF16_WEIGHTS, Copies, weight_only_products
from grouprl.rollout.runner import check_format
from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams
from tests.helpers.rollout import make_model

needs_kernel = pytest.mark.skipif(bf16_weights.unavailable() is not None,
                                  reason=f"bf16-weights kernel: {bf16_weights.unavailable()}")


@pytest.fixture()
def model(tok):
    return make_model(tok, seed=1, head_scale=4.0)


def rounded(w: torch.Tensor) -> torch.Tensor:
    return w.bfloat16().float()


@needs_kernel
def test_packing_is_bf16_rounding_in_panels():
    w = torch.randn(48, 6)
    w[0, 0] = 1 + 2 ** -8  # a tie: rounds to even (1.0)
    w[1, 0] = 1 + 3 * 2 ** -8  # a tie: rounds to even (1 + 2^-6)
    w[2, 0] = float("inf")
    (panels,) = pack(w)
    assert panels.shape == (3, 6, PANEL) and panels.dtype == torch.int16
    as_bf16 = panels.view(torch.bfloat16)
    for p in range(3):
        for k in range(6):
            assert torch.equal(as_bf16[p, k], w[PANEL * p:PANEL * (p + 1), k].bfloat16())
    assert as_bf16[0, 0, 0].item() == 1.0 and as_bf16[0, 0, 1].item() == 1 + 2 ** -6
    assert as_bf16[0, 0, 2].item() == float("inf")


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 16, 17])
@pytest.mark.parametrize("out", [16, 48, 80, 160])  # 1-10 panels: whole and partial groups of 2, 3 and 4
def test_the_product_is_fp32_sums_over_the_rounded_weights(rows, out):
    torch.manual_seed(rows * 1000 + out)
    w, x = torch.randn(out, 38), torch.randn(rows, 38)
    y = product(x, pack(w)[0])
    want = (x.double() @ rounded(w).double().t()).float()
    assert y.shape == (rows, out) and y.dtype == torch.float32
    torch.testing.assert_close(y, want, atol=1e-5, rtol=1e-5)
    assert (y - x @ w.t()).abs().max() > 1e-4  # and not the fp32 weights' product


@needs_kernel
def test_rows_alone_or_together_and_any_threads_give_the_same_numbers():
    torch.manual_seed(0)
    w, x = torch.randn(96, 64), torch.randn(9, 64)
    (panels,) = pack(w)
    together = product(x, panels)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_thread = product(x, panels)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(together, one_thread)  # each output's sum is one thread's, in one order
    alone = torch.cat([product(x[i:i + 1], panels) for i in range(9)])
    torch.testing.assert_close(alone, together, atol=1e-5, rtol=1e-6)  # blocks of rows sum in other orders


@needs_kernel
def test_a_module_product_keeps_leading_dimensions_and_adds_the_bias():
    torch.manual_seed(0)
    layer = nn.Linear(64, 32, bias=True)
    x = torch.randn(2, 3, 64)
    y = bf16_weights_linear(layer, x, pack(layer.weight))
    torch.testing.assert_close(y, x @ rounded(layer.weight).t() + layer.bias, atol=1e-5, rtol=1e-5)
    assert y.shape == (2, 3, 32)
    assert product(torch.empty(0, 64), pack(layer.weight)[0]).shape == (0, 32)


def test_shapes_the_kernel_does_not_take_stay_fp32():
    assert supported(nn.Linear(64, 32)) and supported(nn.Linear(2, 16))
    assert not supported(nn.Linear(64, 40))  # 40 outputs: not whole panels
    assert not supported(nn.Linear(63, 32))  # odd inputs: a panel's cache line holds two input positions
    assert not supported(nn.Linear(64, 32).bfloat16()) and not supported(nn.ReLU())
    with pytest.raises(ValueError, match="out a multiple of 16 and in even"):
        pack(torch.randn(40, 64))
    if bf16_weights.unavailable() is None:
        with pytest.raises(ValueError, match="product takes x"):
            product(torch.randn(2, 65), pack(torch.randn(16, 64))[0])
        with pytest.raises(ValueError, match="in even"):  # the kernel steps two inputs at a time
            product(torch.randn(2, 3), torch.zeros(1, 3, PANEL, dtype=torch.int16))


@needs_kernel
def test_only_supported_products_are_rerouted_and_forwards_come_back():
    wide, narrow = nn.Linear(32, 16), nn.Linear(32, 8)
    copies = Copies(BF16_WEIGHTS)
    x = torch.randn(3, 32)
    with weight_only_products([wide, narrow], copies):
        torch.testing.assert_close(wide(x), x @ rounded(wide.weight).t() + wide.bias, atol=1e-5, rtol=1e-5)
        assert torch.equal(narrow(x), nn.functional.linear(x, narrow.weight, narrow.bias))
    assert copies.nbytes == 16 * 32 * 2 and not any("forward" in m.__dict__ for m in (wide, narrow))
    with pytest.raises(RuntimeError, match="boom"), weight_only_products([wide], copies):
        raise RuntimeError("boom")
    assert "forward" not in wide.__dict__


@needs_kernel
def test_only_one_token_steps_use_the_kernel(model, tok, ids, monkeypatch):
    calls, real = [], bf16_weights.product

    def counted(x, panels):
        calls.append(x.shape[0])
        return real(x, panels)

    monkeypatch.setattr(bf16_weights, "product", counted)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, format="bf16-weights")
    batch = Sampler(model, tok).generate(ids[:2], 2, params, seed=0)
    linears = 2 * 7 + 1  # per step: two layers' seven projections (or their stacks) and the LM head
    steps = batch.lengths.max().item() - 1  # no prefill
    assert steps > 0 and len(calls) % steps == 0 and len(calls) // steps <= linears
    assert max(calls) <= 4  # the running rows, never the prompts' positions


def test_the_format_is_checked_where_the_kernel_cannot_run(monkeypatch):
    with pytest.raises(ValueError, match="bf16-weights runs on a CPU"):
        check_format("bf16-weights", torch.device("cuda"))
    monkeypatch.setattr(bf16_weights, "unavailable", lambda: "no C++ compiler found")
    with pytest.raises(ValueError, match="bf16-weights cannot run here: no C\\+\\+ compiler found"):
        check_format("bf16-weights", torch.device("cpu"))


def test_the_cpu_check_names_what_is_missing():
    assert native.cpu_problem("x86_64", {"avx2", "fma", "sse2"}) is None
    assert "lacks fma" in native.cpu_problem("x86_64", {"avx2"})
    assert "this machine is aarch64" in native.cpu_problem("aarch64", {"avx2", "fma"})


def test_a_missing_build_tool_says_which_and_is_not_asked_again(monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(native, "cpu_problem", lambda: None)
    monkeypatch.setattr(native, "_LOADED", {})
    with pytest.raises(native.KernelUnavailable, match="no C\\+\\+ compiler found .*no-such-compiler"):
        native.load("few_rows")
    monkeypatch.setenv("CXX", "c++")  # a compiler now: the first answer is kept for the process
    with pytest.raises(native.KernelUnavailable, match="no-such-compiler"):
        native.load("few_rows")
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    assert native.build_problem() == "torch's extension builder needs ninja (pip install ninja)"
