"""Config machinery: docstrings, YAML round trip, overrides, errors, --help and README sync.

The example dataclasses below stand in for the trainer's config: a base class (inherited
fields), a frozen nested section whose parent's factory changes a default, and one field of
every supported annotation kind.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from grouprl.config import (
    ConfigError,
    add_dataclass_arguments,
    apply_overrides,
    check_readme,
    config_reference_markdown,
    describe_fields,
    field_docs,
    from_dict,
    load_config,
    load_yaml,
    save_yaml,
    sync_readme,
    to_dict,
)


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    """Softmax temperature; 0 is greedy.
    Second line of the same docstring."""
    stop_strings: tuple[str, ...] = ()
    """Strings that end a completion."""
    autocast_bf16: bool = False
    """Decode under bf16 autocast | faster on AMX."""


@dataclass
class Base:
    seed: int = 0
    """Random seed."""
    output_dir: Path = Path("runs/x")
    """Where the run folder goes."""


@dataclass
class Example(Base):
    model: str = "tiny"
    """Model name or path."""
    lr: float = 1e-6
    """AdamW learning rate. 100% of the updates use it."""
    loss_agg: Literal["token_mean", "seq_mean"] = "token_mean"
    """Loss aggregation."""
    eval_every: int | None = None
    """Evaluate every this many steps (None = only at the end)."""
    group_sizes: tuple[int, ...] = (4, 8)
    undocumented: list[float] = field(default_factory=list)
    sampling: Sampling = field(default_factory=lambda: Sampling(temperature=0.7))
    """How completions are drawn."""
    bf16: bool = True
    """Train under bf16 autocast."""


def test_field_docs_reads_attribute_docstrings_inherited_and_nested():
    docs = field_docs(Example)
    assert docs["lr"] == "AdamW learning rate. 100% of the updates use it."
    assert docs["seed"] == "Random seed."  # inherited from Base
    assert docs["sampling"] == "How completions are drawn."
    assert docs["sampling.temperature"] == "Softmax temperature; 0 is greedy.\nSecond line of the same docstring."
    assert "group_sizes" not in docs and "undocumented" not in docs


def test_from_dict_to_dict_round_trip_through_yaml(tmp_path):
    cfg = Example(seed=3, lr=2.5e-5, loss_agg="seq_mean", eval_every=5, group_sizes=(2,),
                  undocumented=[0.5, 1.0], output_dir=Path("out/run 1"),
                  sampling=Sampling(temperature=0.0, stop_strings=("\n\n", "a,b"), autocast_bf16=True), bf16=False)
    path = save_yaml(cfg, tmp_path / "sub" / "config.yaml")
    assert load_yaml(path, Example) == cfg
    assert from_dict(Example, to_dict(cfg)) == cfg
    assert to_dict(cfg)["sampling"]["stop_strings"] == ["\n\n", "a,b"]  # YAML types only
    assert [p.name for p in path.parent.iterdir()] == ["config.yaml"]  # no temp file left behind


def test_from_dict_converts_yaml_scalars_and_keeps_parent_defaults(tmp_path):
    (tmp_path / "run.yaml").write_text("lr: 1e-5\nmodel: 2024\nsampling:\n  autocast_bf16: yes\n")
    cfg = load_yaml(tmp_path / "run.yaml", Example)
    assert cfg.lr == 1e-5 and isinstance(cfg.lr, float)  # PyYAML reads 1e-5 as a string
    assert cfg.model == "2024"
    # A partial section keeps the 0.7 chosen by Example's default_factory, not Sampling's 1.0.
    assert cfg.sampling == Sampling(temperature=0.7, autocast_bf16=True)


def test_unknown_keys_suggest_closest_dotted_names():
    with pytest.raises(ConfigError) as e:
        from_dict(Example, {"sampling": {"temprature": 1.0}})
    msg = str(e.value)
    assert "'sampling.temprature'" in msg and "did you mean 'sampling.temperature'" in msg
    assert "Valid keys in section 'sampling': temperature, stop_strings, autocast_bf16" in msg
    with pytest.raises(ConfigError, match=r"Unknown config key 'temperature' \(did you mean 'sampling.temperature'"):
        from_dict(Example, {"temperature": 1.0})  # right name, wrong section
    with pytest.raises(ConfigError, match=r"Unknown option '--colour'\. Valid keys at the top level: seed, "):
        apply_overrides(Example(), ["--colour", "1"])  # nothing close: list what there is
    with pytest.raises(ConfigError, match=r"Unknown option '--learning-rate' \(did you mean '--lr'\?\)"):
        apply_overrides(Example(), ["--learning-rate", "1"])  # initials
    with pytest.raises(ConfigError, match=r"did you mean '--sampling.temperature'"):
        apply_overrides(Example(), ["--sampling.temperatur", "1"])


def test_file_errors_name_the_file(tmp_path):
    (tmp_path / "bad.yaml").write_text("lr: [1\n")
    with pytest.raises(ConfigError, match="bad.yaml is not valid YAML"):
        load_yaml(tmp_path / "bad.yaml", Example)
    (tmp_path / "typo.yaml").write_text("seeed: 1\n")
    with pytest.raises(ConfigError, match=r"In .*typo.yaml: Unknown config key 'seeed' \(did you mean 'seed'"):
        load_yaml(tmp_path / "typo.yaml", Example)
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(tmp_path / "missing.yaml", Example)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--lr", "fast"], "Invalid value for '--lr': expected float, got 'fast'"),
        (["--seed=1.5"], "Invalid value for '--seed': expected int"),
        (["--bf16", "maybe"], "Invalid value for '--bf16': expected bool"),
        (["--loss-agg", "token_men"], "not one of {token_mean, seq_mean}. Did you mean 'token_mean'"),
        (["--group-sizes", "4,x"], "Invalid value for '--group_sizes[1]': expected int"),
        (["--lr"], "Option '--lr' needs a value (float)"),
        (["--sampling", "x"], "'--sampling' is a section"),
        (["lr", "1"], "Unexpected command-line argument 'lr'"),
    ],
)
def test_bad_overrides_name_the_key_and_type(args, expected):
    with pytest.raises(ConfigError) as e:
        apply_overrides(Example(), args)
    assert expected in str(e.value)


def test_yaml_type_error_names_the_dotted_key():
    with pytest.raises(ConfigError, match=r"Invalid value for 'sampling.temperature': expected float, got 'hot'"):
        from_dict(Example, {"sampling": {"temperature": "hot"}})


def test_overrides_forms_and_precedence(tmp_path):
    (tmp_path / "run.yaml").write_text("lr: 1.0e-4\nseed: 7\nbf16: true\nsampling:\n  temperature: 0.9\n")
    cfg = load_config(
        Example,
        tmp_path / "run.yaml",
        ["--lr", "1e-5", "--sampling.temperature=0.5", "--no-bf16", "--sampling.autocast-bf16",
         "--eval_every", "none", "--group-sizes", "2,3", "--sampling.stop_strings", '["a,b", "c"]', "--seed", "-2"],
    )
    assert cfg.lr == 1e-5  # the command line wins over the YAML file
    assert cfg.sampling.temperature == 0.5 and cfg.sampling.autocast_bf16 is True
    assert cfg.bf16 is False and cfg.eval_every is None and cfg.seed == -2
    assert cfg.group_sizes == (2, 3) and cfg.sampling.stop_strings == ("a,b", "c")
    assert load_config(Example, tmp_path / "run.yaml").lr == 1e-4  # YAML wins over defaults
    assert apply_overrides(Example(), ["--bf16", "false", "--bf16"]).bf16 is True  # last one wins


def test_overrides_on_a_yaml_dict_do_not_mutate_it():
    data = {"sampling": {"temperature": 0.9}}
    out = apply_overrides(data, ["--sampling.temperature", "0.1"], Example)
    assert out == {"sampling": {"temperature": 0.1}} and data == {"sampling": {"temperature": 0.9}}


def test_argparse_help_comes_from_docstrings_and_collects_overrides():
    parser = argparse.ArgumentParser(prog="grouprl train", allow_abbrev=False)
    add_dataclass_arguments(parser, Example)
    text = " ".join(parser.format_help().split())
    assert "--lr float AdamW learning rate. 100% of the updates use it. [float; default: 1e-06]" in text
    assert "section sampling: How completions are drawn." in text
    assert "Softmax temperature; 0 is greedy. Second line of the same docstring. [float; default: 0.7]" in text
    ns, rest = parser.parse_known_args(["--lr", "1e-5", "--no-bf16", "--sampling.autocast_bf16", "--bogus", "1"])
    assert ns.overrides == ["--lr=1e-5", "--bf16=false", "--sampling.autocast_bf16=true"]
    assert rest == ["--bogus", "1"]
    cfg = apply_overrides(Example(), ns.overrides)
    assert (cfg.lr, cfg.bf16, cfg.sampling.autocast_bf16) == (1e-5, False, True)


def test_reference_markdown_lists_every_field():
    md = config_reference_markdown(Example)
    assert "| `lr` | `float` | `1e-06` | AdamW learning rate. 100% of the updates use it. |" in md
    assert "| `eval_every` | `int \\| None` | `None` |" in md
    assert "| `sampling.autocast_bf16` | `bool` | `false` | Decode under bf16 autocast \\| faster on AMX. |" in md
    assert "**`sampling`**: How completions are drawn." in md
    keys = {row.key for row in describe_fields(Example) if not row.is_section}
    assert all(f"`{key}`" in md for key in keys) and len(keys) == 12


def test_readme_sync_and_drift_detection(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n\n<!-- ref:begin -->\nstale\n<!-- ref:end -->\n\nAfter.\n")
    markers = ("<!-- ref:begin -->", "<!-- ref:end -->")
    assert "out of date" in check_readme(readme, Example, *markers)
    assert sync_readme(readme, Example, *markers) is True
    assert check_readme(readme, Example, *markers) == ""
    assert sync_readme(readme, Example, *markers) is False  # idempotent
    text = readme.read_text()
    assert text.startswith("# Title\n") and text.endswith("<!-- ref:end -->\n\nAfter.\n")
    readme.write_text(text.replace("AdamW learning rate.", "Learning rate."))
    drift = check_readme(readme, Example, *markers)
    assert "-| `lr` | `float` | `1e-06` | Learning rate." in drift
    with pytest.raises(ConfigError, match="must contain the marker line"):
        check_readme(readme, Example, "<!-- nope -->", markers[1])


def test_a_bad_value_from_the_command_line_is_not_blamed_on_the_yaml_file(tmp_path):
    from grouprl.config import ConfigError, TrainConfig, load_config

    path = tmp_path / "run.yaml"
    path.write_text("model: tiny\nlr: 0.001\n")
    with pytest.raises(ConfigError, match=r"^On the command line \(over .*run.yaml\): .*lr=-1.0"):
        load_config(TrainConfig, path, ["--lr=-1"])
    path.write_text("model: tiny\nlr: -1\n")
    with pytest.raises(ConfigError, match=r"^In .*run.yaml: .*lr=-1.0"):
        load_config(TrainConfig, path, ["--seed=3"])


def test_an_empty_value_means_empty_for_an_optional_key():
    from grouprl.config import TrainConfig, load_config

    assert load_config(TrainConfig, None, ["--eval_size="]).eval_size is None


def test_a_config_file_that_is_not_utf8_is_named_with_its_line(tmp_path):
    from grouprl.config import ConfigError, TrainConfig, load_config

    path = tmp_path / "run.yaml"
    path.write_bytes(b"model: tiny\nsystem_prompt: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"run.yaml, line 2: byte 0xe9 is not UTF-8"):
        load_config(TrainConfig, path)
