"""The trainer's config is one flat dataclass made of parts, each the keys of one ``--help`` section: every key is
defined and documented in exactly one part, the sections of ``--help`` and the docs come from the parts alone, the
keys keep one order (config.yaml's, which is --help's), and the flat class still copies with
``dataclasses.replace``, checks and round-trips through YAML."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from grouprl.config import ConfigError, check, field_docs, load_yaml, parse_overrides, save_yaml, to_dict
from grouprl.config.sections import ORDER, SECTIONS, key_sections
from grouprl.config.train_config import TrainConfig
from grouprl.trainer.config import PARTS, RETIRED, EngineKeys, GRPOConfig, TrainerConfig

ROOT = Path(__file__).resolve().parents[2]


def _names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def test_the_trainer_config_is_its_parts_keys_in_order_and_defines_none_itself():
    expected = [name for part in PARTS for name in _names(part)]
    assert _names(TrainerConfig) == expected
    assert len(set(expected)) == len(expected), "a key is defined in two parts"
    assert not TrainerConfig.__dict__.get("__annotations__"), "TrainerConfig defines keys of its own"
    assert not TrainConfig.__dict__.get("__annotations__", {}).keys() - {"BUILT_IN"}
    assert GRPOConfig is TrainerConfig


def test_the_sections_are_the_parts_and_follow_the_config_order():
    parts = {k.__dict__["SECTION"] for k in TrainConfig.__mro__ if "SECTION" in k.__dict__}
    assert parts == set(ORDER), "a part's SECTION is not in ORDER, or a section has no part"
    assert list(dict.fromkeys(SECTIONS.values())) == list(ORDER)
    assert SECTIONS["temperature"] == "sampling" and SECTIONS["max_staleness"] == "precision and engines"
    assert SECTIONS["model"] == SECTIONS["max_prompt_len"] == "model and data"  # a run's part and a trainer's
    assert list(key_sections(TrainerConfig)) == [n for n in _names(TrainerConfig)]  # the trainer's keys in help order

    @dataclasses.dataclass
    class Extra(TrainConfig):
        new_key: int = 0

    assert list(key_sections(Extra))[-1] == "new_key" and key_sections(Extra)["new_key"] == "other options"


def test_every_key_is_documented_once_in_the_file_that_defines_it():
    docs = field_docs(TrainConfig)
    undocumented = [f.name for f in dataclasses.fields(TrainConfig) if not docs.get(f.name, "").strip()]
    assert not undocumented, f"keys without a docstring: {undocumented}"
    for name in _names(TrainConfig):
        owners = [k.__qualname__ for k in TrainConfig.__mro__ if name in k.__dict__.get("__annotations__", {})]
        assert len(owners) == 1, f"{name} is defined in {owners}"
    # a part's docstrings are read from its own module's source
    assert field_docs(EngineKeys)["max_staleness"] == docs["max_staleness"]
    assert docs["max_staleness"].startswith("Asynchronous training:")
    assert docs["output_dir"].startswith("Run folder:")


def test_flat_access_replace_and_checks_span_the_parts():
    config = TrainerConfig(group_size=4, max_staleness=1, rollout_servers=("h:1",), eval_every=3, beta=0.0)
    assert (config.group_size, config.max_staleness, config.eval_every, config.beta) == (4, 1, 3, 0.0)
    assert config.rollout_rows == 4 * 4  # a derived value (ResolvedSettings) reading SamplingKeys' fields
    copy = dataclasses.replace(config, temperature=0.7)
    assert type(copy) is TrainerConfig and copy.temperature == 0.7 and copy.max_staleness == 1
    with pytest.raises(ValueError, match="max_staleness"):
        check(dataclasses.replace(config, rollout_servers=None))  # staleness needs rollout servers
    with pytest.raises(ValueError, match="group_size"):
        check(TrainerConfig(group_size=1))
    with pytest.raises(ValueError, match="rollout_server_restarts is retired: a failed rollout server is dropped"):
        TrainerConfig(rollout_servers=1, rollout_server_restarts=2)


def test_yaml_round_trip_keeps_the_key_order_across_parts(tmp_path):
    config = TrainConfig(model="tiny", lr=3e-5, temperature=0.9, lora_rank=4, save_every=2, stop_strings=("\n",))
    path = save_yaml(config, tmp_path / "config.yaml")
    assert load_yaml(path, TrainConfig) == config
    secret = {f.name for f in dataclasses.fields(TrainConfig) if f.metadata.get("secret")}
    assert secret == {"rollout_server_token", "remote_reward_token"}  # credentials: never written to config.yaml
    assert list(to_dict(config)) == [name for name in _names(TrainConfig) if name not in secret]


def test_a_retired_key_is_refused_with_its_replacement_from_yaml_the_command_line_and_python(tmp_path):
    replacement = "tensorboard is retired: use loggers: [tensorboard]"
    with pytest.raises(ConfigError, match=re.escape(replacement)):
        TrainConfig(tensorboard=True)
    with pytest.raises(ConfigError, match=re.escape(replacement)):
        TrainerConfig(lr=1e-5, tensorboard=False)
    for flag in ("--tensorboard", "--no-tensorboard", "--tensorboard=false"):
        with pytest.raises(ConfigError, match=re.escape(f"-{replacement}")):
            parse_overrides([flag], TrainConfig)
    path = tmp_path / "config.yaml"
    path.write_text("lr: 1.0e-5\ntensorboard: true\n")
    with pytest.raises(ConfigError, match=f"In {re.escape(str(path))}: {re.escape(replacement)}"):
        load_yaml(path, TrainConfig)
    assert set(RETIRED) == {"tensorboard", "rollout_server_restarts"} and not RETIRED.keys() & set(_names(TrainConfig))


def test_a_committed_run_folders_config_loads_once_its_retired_keys_are_dropped(tmp_path):
    path = ROOT / "benchmarks" / "results" / "smollm2-30-steps" / "config.yaml"
    if not path.is_file():
        pytest.skip(f"{path} is not in this checkout")
    text = path.read_text()
    kept = "".join(line for line in text.splitlines(keepends=True) if line.split(":")[0] not in RETIRED)
    (tmp_path / "config.yaml").write_text(kept)
    config = load_yaml(tmp_path / "config.yaml", TrainConfig)
    assert isinstance(config, TrainerConfig) and config.total_steps == 30
