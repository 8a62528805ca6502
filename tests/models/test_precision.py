"""dtype: auto: fp32 against bf16 measured at the model's shapes, picked per phase, cached per machine;
the rollout correction turns on when rollouts and training use different formats."""

from __future__ import annotations

import pytest

import grouprl.models.precision as precision
from grouprl.models import tiny_causal_lm
from grouprl.models.precision import Precision, choose_precision
from grouprl.trainer.config import TrainerConfig


@pytest.fixture()
def model():
    return tiny_causal_lm(seed=0)[0]


def fake_speedups(monkeypatch, decode, train, int8=None, weights=None):
    calls = []

    def speedup(m, k, n, device, count=1):
        calls.append((m, k, n))
        return decode if m <= 64 else train

    monkeypatch.setattr(precision, "bf16_speedup", speedup)
    monkeypatch.setattr(precision, "int8_speedup", lambda m, k, n, device, count=1: int8)
    monkeypatch.setattr(precision, "bf16_weights_speedup", lambda m, k, n, device, count=1: weights)
    return calls


def test_forced_formats_are_not_measured(model, monkeypatch, tmp_path):
    calls = fake_speedups(monkeypatch, 3.0, 3.0)
    assert choose_precision("fp32", "auto", model, 32, 800, tmp_path / "c.json") == Precision("fp32", "fp32", "fp32",
                                                                                              how="forced")
    assert choose_precision("bf16", "fp32", model, 32, 800, tmp_path / "c.json").reference == "fp32"
    assert choose_precision("fp32", "auto", model, 32, 800, tmp_path / "c.json", rollout_dtype="int8") == \
        Precision("int8", "fp32", "fp32", how="forced")
    assert calls == []


def test_forced_bf16_weights_need_a_cpu_that_runs_their_kernel(model, monkeypatch):
    import torch

    from grouprl.errors import ConfigError
    from grouprl.rollout import bf16_weights

    with pytest.raises(ConfigError, match="rollout_dtype=bf16-weights runs on a CPU"):
        choose_precision("auto", "auto", model, 32, 800, device=torch.device("cuda"), rollout_dtype="bf16-weights")
    monkeypatch.setattr(bf16_weights, "unavailable", lambda: "no C++ compiler found")
    with pytest.raises(ConfigError, match="rollout_dtype=bf16-weights cannot run here: no C\\+\\+ compiler found"):
        choose_precision("fp32", "auto", model, 32, 800, rollout_dtype="bf16-weights")


def test_a_forced_rollout_format_leaves_the_other_phases_measured(model, monkeypatch, tmp_path):
    calls = fake_speedups(monkeypatch, 0.01, 2.0, int8=3.0)
    chosen = choose_precision("auto", "auto", model, 32, 800, tmp_path / "c.json", rollout_dtype="fp32")
    assert (chosen.rollout, chosen.train, chosen.int8_speedup) == ("fp32", "bf16", 3.0) and len(calls) == 2


def test_int8_rollouts_need_a_cpu(model):
    import torch

    from grouprl.errors import ConfigError

    with pytest.raises(ConfigError, match="rollout_dtype=int8 runs on a CPU"):
        choose_precision("auto", "auto", model, 32, 800, device=torch.device("cuda"), rollout_dtype="int8")


@pytest.mark.parametrize("bf16, weights, int8, want", [
    (0.01, 1.6, 2.0, "bf16-weights"),  # AVX2 only: bf16 copies of the weights win; int8 reported, not used
    (0.01, None, 2.0, "fp32"),  # the same where the bf16-weights kernel cannot run (no compiler, not x86)
    (0.66, 1.05, 1.3, "fp32"),  # bf16-weights within the margin of fp32
    (2.7, None, None, "bf16"),  # AMX: bf16 wins, the weight-only formats not timed
    (1.05, 1.05, 1.12, "fp32"),  # bf16 within the margin of fp32, and so is bf16-weights
    (1.05, 1.3, None, "bf16-weights"),  # bf16 within the margin, bf16-weights past it
])
def test_auto_rollouts_pick_bf16_weights_where_bf16_loses_and_report_int8(model, monkeypatch, tmp_path, bf16,
                                                                           weights, int8, want):
    calls = fake_speedups(monkeypatch, bf16, 0.5, int8=int8, weights=weights)
    chosen = choose_precision("auto", "auto", model, 32, 800, tmp_path / "c.json")
    timed = bf16 < precision.MARGIN
    assert chosen.rollout == want and len(calls) == 2
    assert (chosen.int8_speedup, chosen.bf16_weights_speedup) == ((int8, weights) if timed else (None, None))


@pytest.mark.parametrize("decode, train, want", [
    (2.7, 2.3, ("bf16", "bf16", "bf16")),  # a Zen 4 with AVX-512 BF16
    (0.01, 0.004, ("fp32", "fp32", "fp32")),  # an AVX2-only CPU
    (1.3, 1.05, ("bf16", "fp32", "fp32")),  # bf16 wins only at decode sizes, and 5% is within the margin
])
def test_auto_picks_each_phase_by_its_measured_speedup(model, monkeypatch, tmp_path, decode, train, want):
    fake_speedups(monkeypatch, decode, train)
    chosen = choose_precision("auto", "auto", model, 32, 800, tmp_path / "c.json")
    assert (chosen.rollout, chosen.train, chosen.reference) == want
    assert chosen.how == "measured" and "rollouts" in chosen.describe()


def test_the_probe_runs_once_per_machine_and_shape(model, monkeypatch, tmp_path):
    calls = fake_speedups(monkeypatch, 2.0, 2.0)
    cache = tmp_path / "c.json"
    first = choose_precision("auto", "auto", model, 32, 800, cache)
    second = choose_precision("auto", "auto", model, 32, 800, cache)
    assert len(calls) == 2 and (first.rollout, second.how) == ("bf16", "cached")
    assert calls[0][0] == 16  # decode-sized: half the rollout's rows, as most steps run fewer than all
    choose_precision("auto", "auto", model, 16, 800, cache)  # another rollout size: measured again
    assert len(calls) == 4


@pytest.mark.parametrize("missing", ["int8", "bf16_weights"])
def test_a_cache_entry_without_a_weight_only_ratio_is_measured_again(model, monkeypatch, tmp_path, missing):
    import json

    cache = tmp_path / "c.json"
    fake_speedups(monkeypatch, 0.01, 0.01, int8=2.0, weights=1.5)
    choose_precision("auto", "auto", model, 32, 800, cache)
    entries = json.loads(cache.read_text())
    for entry in entries.values():  # as an earlier version wrote it
        del entry[missing]
    cache.write_text(json.dumps(entries))
    again = choose_precision("auto", "auto", model, 32, 800, cache)
    assert (again.how, again.int8_speedup, again.bf16_weights_speedup) == ("measured", 2.0, 1.5)
    assert "rollouts bf16-weights (bf16 0.01x fp32, bf16-weights 1.50x, int8 2.00x)" in again.describe()
    cached = choose_precision("auto", "auto", model, 32, 800, cache)
    assert (cached.how, cached.rollout, cached.bf16_weights_speedup) == ("cached", "bf16-weights", 1.5)
    assert Precision("int8", "fp32", "fp32", int8_speedup=1.5).describe().startswith("rollouts int8 (int8 1.50x fp32)")
    assert Precision("fp32", "fp32", "fp32", how="forced").describe() == \
        "rollouts fp32, training fp32, reference fp32 [forced]"


def test_an_instruction_set_cap_is_another_machine(model, monkeypatch, tmp_path):
    """ONEDNN_MAX_CPU_ISA=AVX2 makes bf16 products tens of times slower on a CPU whose flags promise
    bf16 units: a ratio measured without the cap must not be reused under it."""
    calls = fake_speedups(monkeypatch, 2.0, 2.0)
    cache = tmp_path / "c.json"
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    choose_precision("auto", "auto", model, 32, 800, cache)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    fake_speedups(monkeypatch, 0.02, 0.02)
    capped = choose_precision("auto", "auto", model, 32, 800, cache)
    assert len(calls) == 2 and capped.how == "measured" and capped.train == "fp32"


def test_a_hopeless_bf16_is_not_timed_at_the_large_size(monkeypatch):
    sizes = []

    def time_it(m, k, n, dtype, device, repeats=3, count=1):
        sizes.append(m)
        return 1.0 if dtype.is_floating_point and dtype.itemsize == 4 else 50.0  # bf16 50x slower

    monkeypatch.setattr(precision, "_time", time_it)
    import torch

    assert precision.bf16_speedup(2048, 576, 1536, torch.device("cpu")) == pytest.approx(0.02)
    assert sizes == [64, 64]


def test_the_real_probe_is_quick_and_gives_a_ratio(model, tmp_path):
    import time

    start = time.perf_counter()
    chosen = choose_precision("auto", "auto", model, 32, 512, tmp_path / "c.json")
    assert time.perf_counter() - start < 2.0 and chosen.decode_speedup > 0 and chosen.train_speedup > 0
    assert chosen.int8_speedup > 0  # the tiny model's width (64) is one the int8 kernel takes
    from grouprl.rollout.bf16_weights import unavailable

    assert (chosen.bf16_weights_speedup is None) == (unavailable() is not None)


def test_int8_is_not_timed_where_its_kernel_cannot_run():
    import torch

    assert precision.int8_speedup(8, 72, 128, torch.device("cpu")) is None  # 72 is not a multiple of 16
    assert precision.int8_speedup(8, 64, 128, torch.device("cuda")) is None


def test_the_rollout_correction_follows_the_formats():
    config = TrainerConfig()
    assert config.rollout_is == "auto" and config.rollout_is_level == "none"
    config.precision = Precision("bf16", "fp32", "fp32")
    assert config.rollout_is_level == "token" and config.rollout_bf16
    # on-policy grpo forms the weights in its update from its own pass; trpo needs a pass before its step
    assert config.rollout_is_in_update and not config.needs_old_logprobs
    trpo = TrainerConfig(algo="trpo")
    trpo.precision = Precision("bf16", "fp32", "fp32")
    assert not trpo.rollout_is_in_update and trpo.needs_old_logprobs
    off_policy = TrainerConfig(mu=2)
    off_policy.precision = Precision("bf16", "fp32", "fp32")
    assert not off_policy.rollout_is_in_update and off_policy.needs_old_logprobs
    config.precision = Precision("bf16", "bf16", "bf16")  # bf16 weights decode, autocast trains: not the same
    assert config.rollout_is_level == "token"
    config.precision = Precision("fp32", "fp32", "bf16")  # a bf16 reference changes only the KL term
    assert config.rollout_is_level == "none"
    config.precision = Precision("int8", "fp32", "fp32")  # int8 rollouts sample a quantized copy
    assert config.rollout_is_level == "token" and config.rollout_format == "int8" and not config.rollout_bf16
    assert TrainerConfig(rollout_is="sequence").rollout_is_level == "sequence"

