"""dtype: auto decided by the rule table from what the machine is (faked CPU features here), forced formats,
the rollout correction following the formats, and the trainer deciding once and recording its decision."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

import grouprl.models.precision as precision
from grouprl.errors import ConfigError
from grouprl.models.precision import RULES, Formats, Machine, resolve_formats, rule_for
from grouprl.trainer.config import TrainerConfig
from tests.helpers.trainer import make_trainer

AVX2 = Machine(vendor="AuthenticAMD", flags=frozenset({"avx", "avx2", "fma"}), capability="AVX2")
"""A Zen 3."""
ZEN4 = Machine(vendor="AuthenticAMD", flags=frozenset({"avx2", "fma", "avx512f", "avx512_bf16"}),
               capability="AVX512")
XEON_NO_AMX = Machine(vendor="GenuineIntel", flags=ZEN4.flags, capability="AVX512")
AMX = Machine(vendor="GenuineIntel", flags=ZEN4.flags | {"amx_bf16", "amx_tile"}, capability="AVX512")


def formats(machine: Machine, dtype="auto", ref_dtype="auto", rollout_dtype="auto") -> tuple[str, str, str, str]:
    f = resolve_formats(dtype, ref_dtype, rollout_dtype, machine=machine)
    return f.rollout, f.train, f.reference, f.rule


@pytest.mark.parametrize("machine, want", [
    (AVX2, ("fp32", "fp32", "fp32", "avx2")),
    (ZEN4, ("bf16", "bf16", "bf16", "avx512-bf16-amd")),
    (XEON_NO_AMX, ("fp32", "fp32", "fp32", "avx512-bf16-no-amx")),  # the flag alone is not enough
    (AMX, ("bf16", "bf16", "bf16", "amx")),
    (Machine(flags=frozenset(), arch="aarch64"), ("fp32", "fp32", "fp32", "other")),
    (Machine("cuda", gpu_bf16=True, gpu_name="H100"), ("bf16", "bf16", "bf16", "gpu-bf16")),
    (Machine("cuda", gpu_bf16=False), ("fp32", "fp32", "fp32", "gpu")),
])
def test_each_kind_of_machine_gets_its_rows_formats(machine, want):
    assert formats(machine) == want


@pytest.mark.parametrize("cap, aten, want", [
    ("AVX2", "AVX512", "avx2"),  # oneDNN capped to AVX2: no bf16 dot products, no tiles
    ("AVX512_CORE_BF16", "AVX512", "avx512-bf16-no-amx"),  # bf16 dot products, tiles capped off
    ("avx10_1_512", "AVX512", "avx512-bf16-no-amx"),  # an alias of AVX512_CORE_FP16, below AMX; any case
    ("AVX512_CORE_AMX", "AVX512", "amx"),
    ("ALL", "AVX512", "amx"),
    ("", "AVX2", "avx2"),  # ATEN_CPU_CAPABILITY=avx2: ATen's bf16 kernels would run AVX2 code
])
def test_a_capped_amx_cpu_is_decided_by_what_its_kernels_may_use(cap, aten, want):
    machine = Machine(vendor=AMX.vendor, flags=AMX.flags, capability=aten, onednn_cap=cap.upper())
    assert rule_for(machine).name == want


def test_this_machine_reads_the_caps_from_the_environment(monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    machine = precision.this_machine()
    assert machine.onednn_cap == "AVX2" and machine.capability == torch.backends.cpu.get_cpu_capability()
    assert rule_for(machine).name in ("avx2", "other")  # whatever the CPU, bf16 units are capped off


def test_the_same_machine_gets_the_same_formats_whatever_its_load(monkeypatch):
    """Nothing is timed: a slow clock (a loaded machine) cannot change the decision."""
    import time

    first = resolve_formats("auto", "auto", "auto")
    monkeypatch.setattr(time, "perf_counter", lambda: pytest.fail("dtype auto timed something"))
    assert all(resolve_formats("auto", "auto", "auto") == first for _ in range(3))


def test_every_row_names_its_measurement_and_the_last_one_catches_all():
    assert all(rule.measured and rule.why for rule in RULES)
    assert RULES[-1].applies(Machine(flags=frozenset(), capability="DEFAULT", arch="riscv64"))
    assert len({rule.name for rule in RULES}) == len(RULES)


def test_forced_formats_keep_working_and_partial_forcing_keeps_the_rule_elsewhere():
    assert formats(AMX, dtype="fp32") == ("fp32", "fp32", "fp32", "forced")
    assert formats(AVX2, dtype="bf16", ref_dtype="fp32") == ("bf16", "bf16", "fp32", "forced")
    assert formats(AMX, rollout_dtype="fp32") == ("fp32", "bf16", "bf16", "amx")
    assert formats(AMX, ref_dtype="fp32")[2] == "fp32"
    line = resolve_formats("fp32", "auto", "bf16", machine=AVX2).describe()
    assert line == "rollouts bf16, training fp32, reference fp32 — set: dtype=fp32, rollout_dtype=bf16 (rule forced)"
    line = resolve_formats("auto", "auto", "auto", machine=AVX2).describe()
    assert line.startswith("rollouts fp32, training fp32, reference fp32 — AVX2 without bf16 units: ")
    assert line.endswith("(rule avx2)")


def test_recorded_formats_win_over_the_machine_but_not_over_a_forced_format():
    recorded = Formats("bf16", "bf16", "bf16", "amx", "AMX bf16 units")
    assert formats(AVX2) != ("bf16", "bf16", "bf16", "amx")
    got = resolve_formats("auto", "auto", "auto", machine=AVX2, recorded=recorded)
    assert (got.rollout, got.train, got.reference, got.rule) == ("bf16", "bf16", "bf16", "amx")
    assert "as the checkpoint recorded" in got.reason
    assert resolve_formats("fp32", "auto", "auto", recorded=recorded).train == "fp32"
    assert Formats.from_dict(recorded.as_dict()) == recorded and Formats.from_dict(None) is None


def test_forced_bf16_weights_need_a_cpu_that_runs_their_kernel(monkeypatch):
    from grouprl.rollout.cpu import bf16_weights

    with pytest.raises(ConfigError, match="rollout_dtype=bf16-weights runs on a CPU"):
        resolve_formats("auto", "auto", "bf16-weights", device=torch.device("cuda"))
    monkeypatch.setattr(bf16_weights, "unavailable", lambda: "no C++ compiler found")
    with pytest.raises(ConfigError, match="rollout_dtype=bf16-weights cannot run here: no C\\+\\+ compiler found"):
        resolve_formats("fp32", "auto", "bf16-weights")


def test_the_rollout_correction_follows_the_formats():
    config = TrainerConfig()
    assert config.rollout_is == "auto" and config.rollout_is_level == "none"
    config = TrainerConfig(dtype="fp32", rollout_dtype="bf16")
    assert config.rollout_is_level == "token" and config.rollout_bf16
    # on-policy grpo forms the weights in its update from its own pass; trpo needs a pass before its step
    assert config.rollout_is_in_update and not config.needs_old_logprobs
    trpo = TrainerConfig(algo="trpo", dtype="fp32", rollout_dtype="bf16")
    assert not trpo.rollout_is_in_update and trpo.needs_old_logprobs
    off_policy = TrainerConfig(mu=2, dtype="fp32", rollout_dtype="bf16")
    assert not off_policy.rollout_is_in_update and off_policy.needs_old_logprobs
    # bf16 weights decode, autocast trains: not the same numbers
    assert TrainerConfig(dtype="bf16").rollout_is_level == "token"
    # a bf16 reference changes only the KL term
    assert TrainerConfig(dtype="fp32", ref_dtype="bf16").rollout_is_level == "none"
    weights = TrainerConfig(dtype="fp32", rollout_dtype="bf16-weights")
    assert weights.rollout_is_level == "token" and not weights.rollout_bf16
    assert TrainerConfig(rollout_is="sequence").rollout_is_level == "sequence"


def _on(monkeypatch, machine: Machine) -> None:
    monkeypatch.setattr(precision, "this_machine", lambda device=None: machine)


def test_the_trainer_records_its_formats_in_summary_config_yaml_and_checkpoints(tmp_path, monkeypatch):
    _on(monkeypatch, AVX2)
    trainer = make_trainer(tmp_path, dtype="auto", total_steps=1)
    assert trainer.config.dtype == "fp32" and trainer.config.rollout_dtype == "fp32"
    assert trainer.setup["formats"].endswith("(rule avx2)")
    trainer.train()
    run = tmp_path / "run"
    written = yaml.safe_load((run / "config.yaml").read_text())
    assert (written["dtype"], written["ref_dtype"], written["rollout_dtype"]) == ("fp32", "fp32", "fp32")
    assert json.loads((run / "summary.json").read_text())["setup"]["formats"] == trainer.setup["formats"]
    state = json.loads((run / "checkpoints" / "step-000001" / "state.json").read_text())
    assert state["formats"]["rule"] == "avx2" and state["config"]["dtype"] == "fp32"


def test_a_resumed_run_keeps_its_formats_on_another_machine(tmp_path, monkeypatch):
    _on(monkeypatch, AMX)  # bf16 everywhere (emulated on a CPU without bf16 units: slow, but a tiny model)
    first = make_trainer(tmp_path, dtype="auto", total_steps=1)
    first.train()
    _on(monkeypatch, AVX2)  # would be fp32 if decided again
    resumed = make_trainer(tmp_path, dtype="auto", total_steps=2, resume_from="latest")
    assert (resumed.formats.rollout, resumed.formats.train, resumed.formats.rule) == ("bf16", "bf16", "amx")
    assert resumed.config.dtype == "bf16" and "as the checkpoint recorded" in resumed.setup["formats"]
    resumed.train()
    written = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert written["dtype"] == "bf16"  # the rerun of config.yaml repeats them too
