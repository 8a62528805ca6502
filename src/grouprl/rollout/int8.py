"""Decode steps with weight-only int8 products: each weight row quantized to int8 with one scale, the
activations rounded to bf16 at the product's input, PyTorch's ``_weight_int8pack_mm`` CPU kernel.

A decode step of a few running rows reads every weight of the model once for a handful of dot products, so
on a CPU without bf16 units (AVX2 only, where bf16 products are tens of times slower than fp32) the fp32
weights' bytes and the BLAS's few-row kernels set its time. The int8 kernel reads a quarter of those bytes
and takes bf16 activations without bf16 units. SmolLM2-135M's decode shapes, one thread, with the
kernels limited to AVX2 on a 2-core Intel Xeon (``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python
benchmarks/products.py --threads 1``, log ``benchmarks/results/products/xeon-avx2-capped.log``): the 49k x
576 LM head at 2 / 4 / 8 / 16 rows took 5.8 / 8.4 / 14.9 / 19.1 ms in int8 against 10.4 / 15.0 / 18.4 /
18.6 for the fastest of the fp32 layouts the engine learns (:mod:`grouprl.rollout.skinny`), a gate or up
projection 0.22 / 0.28 / 0.46 / 0.77 against 0.39 / 0.61 / 0.76 / 0.66 ms. Few-row steps, which most of a
rollout's are (rows stop at different steps), gain most; on a CPU with AMX, bf16 is faster still (the same
log for AMX: ``xeon-amx.log``). ``dtype: auto`` measures int8 where bf16 loses and prints the ratio
(:mod:`grouprl.models.precision`), but rollouts run in int8 only when asked (``rollout_dtype: int8``): on the
demo's task held-out accuracy with int8 rollouts trailed fp32's (``benchmarks/results/int8-rollouts/``).
Whole rollouts of 16 x 64 on the capped Xeon: 54.1 tokens/s in int8 against 35.7 in fp32 (``python
benchmarks/rollout.py --threads 1 --formats fp32,int8 --no_vllm --settings 16x64 --repeats 3 --warmup 1``,
log ``benchmarks/results/rollout/xeon-avx2-capped-fp32-int8.log``). The kernel's AVX2 time grows with the
rows, as if it converted the weights again for every row (the profile in
``benchmarks/results/decode_steps/xeon-avx2-capped-int8-eager.log``: 61% of a rollout's time).

Only one-token decode steps run in int8; prefills (many rows, where the BLAS is efficient) and everything
between the products (norms, rotary, attention, residuals) stay in the model's format. Rows are quantized
symmetrically, ``q = round(w / s)`` with ``s = max|w_row| / 127``, once per decode loop (the weights change
between rollouts), on first use. The sampled tokens' log-probs are the int8 policy's; the trainer's
importance correction (``rollout_is``) accounts for the difference from its own fp32 or bf16 passes.

The kernel reads wrong memory for an input width that is not a multiple of 16 (seen with the AVX-512
kernel; 8 with AVX2's): such products, and any whose weight is not an fp32 ``nn.Linear``'s, stay in fp32.
"""

from __future__ import annotations

import torch
from torch import nn

WIDTH_MULTIPLE = 16
"""Input widths the int8 kernel reads correctly on every CPU kernel (AVX-512 needs 16, AVX2 8)."""
CHUNK_ROWS = 4096
"""Rows quantized at a time: the intermediate stays in cache instead of four passes over a large weight."""


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8 quantization of a float weight ``[out, in]``.

    Returns ``(q, scales)``: ``q`` [out, in] int8 with ``q = round(w / s)`` in [-127, 127], ``scales``
    [out] bfloat16 with ``s = max|w_row| / 127`` (1 for an all-zero row). ``q * s`` approximates ``w``
    to half a step of its row, plus the scale's bf16 rounding (the kernel takes scales in the
    activations' format), which the quantization here accounts for by dividing by the rounded scale.
    """
    out = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
    scales = torch.empty(weight.shape[0], dtype=torch.bfloat16, device=weight.device)
    for start in range(0, weight.shape[0], CHUNK_ROWS):
        rows = weight[start:start + CHUNK_ROWS].detach().float()
        s = (rows.abs().amax(1) / 127).bfloat16()
        s = torch.where(s > 0, s, torch.ones_like(s))
        scales[start:start + CHUNK_ROWS] = s
        # a row's largest value may round to 127.5 / 127 of its scale after the scale's bf16 rounding
        out[start:start + CHUNK_ROWS] = (rows / s.float()[:, None]).round_().clamp_(-127, 127)
    return out, scales


def supported(module: nn.Linear) -> bool:
    """Whether ``module``'s products can run on an int8 copy of its weight."""
    weight = module.weight
    return weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.dim() == 2 and \
        module.in_features % WIDTH_MULTIPLE == 0


def int8_linear(module: nn.Linear, x: torch.Tensor, copy: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``module(x)`` on ``copy``, its weight's :func:`quantize_rows`: x [..., in] -> [..., out], in x's format."""
    q, scales = copy
    flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()  # [rows, in]
    y = torch.ops.aten._weight_int8pack_mm(flat, q, scales).to(x.dtype)  # [rows, out]
    if module.bias is not None:
        y = y + module.bias
    return y.reshape(*x.shape[:-1], y.shape[-1])
