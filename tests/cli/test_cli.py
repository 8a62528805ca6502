"""The command line: parsing and precedence, errors and exit codes, the run-level config, and
the commands end to end on a tiny model (``demo --quick`` in a subprocess, as a user runs it)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from grouprl.cli import main
from grouprl.cli.build import answer_checker, build_inputs, resolve_model_path
from grouprl.cli.commands import before_after
from grouprl.config import ConfigError, TrainConfig, check, load_config, save_yaml
from grouprl.errors import CheckpointError
from grouprl.registry import import_object
from grouprl.rewards import reward_name
from tests.helpers.vllm import HAVE_VLLM

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_PROMPTS = ROOT / "examples" / "dataset" / "prompts.jsonl"
LAST_LINE = re.compile(r"^accuracy before=(\d\.\d{3}) after=(\d\.\d{3})$")


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def resolved(capsys, *argv: str) -> dict:
    code, out, err = run_main(capsys, *argv, "--print-config")
    assert code == 0, err
    return yaml.safe_load(out)


def tiny_run_args(tmp_path: Path, *extra: str) -> list[str]:
    """A train run that takes a couple of seconds: tiny model, quick demo reward, 2 steps."""
    return ["--model", "tiny", "--reward_functions", "grouprl.cli.demo:digit_share",
            "--accuracy_fn", "grouprl.cli.demo:only_digits", "--prompts_per_step", "2", "--group_size", "4",
            "--max_new_tokens", "4", "--total_steps", "2", "--lr", "1e-3", "--eval_size", "4", "--eval_samples", "2",
            "--train_size", "16", "--no-progress", "--output_dir", str(tmp_path / "run"), *extra]


# --------------------------------------------------------------------------- parsing and precedence


def test_help_comes_from_the_field_docstrings(capsys):
    code, out, _ = run_main(capsys, "train", "--help", "all")
    assert code == 0
    assert "--group_size" in out and "completions per prompt" in out  # a trainer field, inherited
    assert "--reward_functions" in out and "module:function" in out  # a run-level field
    code, out, _ = run_main(capsys, "eval", "--help")
    assert code == 0 and "--samples" in out and "--lr " not in out  # only the keys that matter to eval


def test_defaults_then_yaml_then_command_line(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 1.0e-5\ngroup_size: 4\ntask_options: {digits: 2}\n")
    config = resolved(capsys, "train", "--config", path, "--lr", "3e-5", "--no-progress")
    assert config["lr"] == 3e-5  # the command line wins
    assert config["group_size"] == 4 and config["task_options"] == {"digits": 2}  # from the file
    assert config["progress"] is False and config["beta"] == 0.04  # flag form; a default


def test_demo_settings_sit_between_defaults_and_overrides(capsys):
    quick = resolved(capsys, "demo", "--quick", "--total_steps", "3")
    assert quick["model"] == "tiny" and quick["total_steps"] == 3
    full = resolved(capsys, "demo")
    assert full["model"] == "smollm2-135m" and full["output_dir"] == "runs/demo"


def test_yaml_round_trip_of_the_run_config(tmp_path):
    config = TrainConfig(task="countdown", task_options={"count": 4, "max_number": 30}, reward_functions=(
        "exact_match", "length_target", "examples/dataset/rewards.py:concise"), reward_options={
        "length_target": {"target": 8}}, reward_weights=(1.0, 0.5, 0.1), lr=3e-5, stop_strings=("\n\n",),
        eval_size=0, minibatch_size=16)
    again = load_config(TrainConfig, save_yaml(config, tmp_path / "c.yaml"))
    assert again == config


def test_a_dataset_replaces_the_task():
    config = TrainConfig(dataset=str(EXAMPLE_PROMPTS), reward_functions=("exact_match",))
    assert config.task == ""  # written empty in the resolved config: the prompts come from the file
    assert replace(config) == config  # and the resolved config builds again


@pytest.mark.parametrize("kwargs, message", [
    (dict(task="arithmatic"), "did you mean 'arithmetic'"),
    (dict(task_options={"digit": 2}), "valid options: digits"),
    (dict(reward_functions=("exact_mach",)), "did you mean 'exact_match'"),
    (dict(reward_functions=("length_target",)), "reward_options"),
    (dict(reward_functions=("mymodule:",)), "import path"),
    (dict(reward_options={"format": {}}), "reward_functions does not list"),
    (dict(reward_weights=(1.0, 2.0)), "2 values for 1 reward functions"),
    (dict(dataset=str(EXAMPLE_PROMPTS)), "a dataset needs reward_functions"),
    (dict(dataset=str(EXAMPLE_PROMPTS), reward_functions=("exact_match",), task_options={"digits": 2}), "task_options"),
    # the file is checked first: what else is wrong may follow from it (no reward functions named here)
    (dict(dataset="nope.jsonl"), "dataset: prompt file 'nope.jsonl' does not exist"),
    (dict(dataset=str(EXAMPLE_PROMPTS), eval_dataset="held/out.jsonl", reward_functions=("exact_match",)),
     "eval_dataset: prompt file 'held/out.jsonl' does not exist"),
    (dict(prompt_column="question"), "apply to a dataset"),
    (dict(task=""), "nothing to train on"),
    (dict(eval_fraction=1.0), "eval_fraction"),
    (dict(accuracy_fn="exact_match"), "import path"),
])
def test_run_config_validation_names_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        check(TrainConfig(**kwargs))


# --------------------------------------------------------------------------- errors and exit codes


def one_paragraph(err: str) -> bool:
    """The error is one paragraph, after any phase lines the command printed as it went (cli.phases)."""
    lines = err.splitlines()
    while lines and lines[0].startswith("grouprl: ") and not lines[0].startswith("grouprl: error: "):
        lines = lines[1:]
    err = "\n".join(lines)
    return err.startswith("grouprl: error: ") and "Traceback" not in err and "\n\n" not in err.strip()


@pytest.mark.parametrize("argv, expected", [
    (["train", "--learning_rate", "1e-5"], "did you mean '--lr'"),
    (["train", "--group", "4"], "did you mean '--group_by' or '--group_size'"),  # no silent prefix matching
    (["train", "--task", "arithmatic"], "did you mean 'arithmetic'"),
    (["train", "--group_size", "many"], "expected int"),
    (["train", "--config", "no/such/run.yaml"], "does not exist"),
    (["eval", "--samples", "0"], "eval_samples=0 must be >= 1"),
    (["report", "no/such/run"], "does not exist"),
    (["train-rm", "--model", "tiny"], "Missing required config key(s): pairs"),
])
def test_bad_input_exits_2_with_one_paragraph(capsys, argv, expected):
    code, out, err = run_main(capsys, *argv, *(["--print-config"] if argv[0] != "report" else []))
    assert code == 2
    assert one_paragraph(err) and expected in err, err
    assert out == ""


def test_unknown_yaml_key_names_the_file_and_suggests(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("group_sise: 4\n")
    code, _, err = run_main(capsys, "train", "--config", path, "--print-config")
    assert code == 2 and str(path) in err and "group_size" in err and one_paragraph(err)


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(ConfigError, match="arithmatic"):
        main(["train", "--task", "arithmatic", "--debug", "--print-config"])


def test_unexpected_failure_exits_1_and_points_to_debug(monkeypatch, capsys):
    def broken(config, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr("grouprl.cli.commands.train", broken)
    code, _, err = run_main(capsys, "train", "--model", "tiny")
    assert code == 1 and "RuntimeError: disk on fire" in err and "--debug" in err


def test_cheap_checks_fail_before_the_model_loads(tmp_path, monkeypatch, capsys):
    def no_model(*args, **kwargs):
        raise AssertionError("the model must not be loaded")

    monkeypatch.setattr("grouprl.cli.commands.load_model", no_model)
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "solution": i}) + "\n" for i in range(8)))
    code, _, err = run_main(capsys, "train", "--dataset", data, "--reward_functions", "exact_match")
    assert code == 2 and "'answer'" in err and "solution" in err and one_paragraph(err)  # column, and what exists
    code, _, err = run_main(capsys, "train", "--dataset", tmp_path / "missing.jsonl", "--reward_functions",
                            "exact_match")
    assert code == 2 and "does not exist" in err
    code, _, err = run_main(capsys, "train", "--reward_functions", "no_such_module_here:score")
    assert code == 2 and "no_such_module_here" in err


# --------------------------------------------------------------------------- building a run


def test_dataset_example_builds_with_its_custom_reward(monkeypatch):
    monkeypatch.chdir(ROOT)  # the example's paths are relative to the repository root
    config = load_config(TrainConfig, "examples/dataset/run.yaml")
    inputs = build_inputs(config)
    assert (len(inputs.train_rows), len(inputs.eval_rows)) == (8, 4)
    assert [reward_name(f) for f in inputs.reward_fns] == ["exact_match", "concise"]
    assert inputs.reward_weights == [1.0, 0.2]
    assert inputs.is_correct is answer_checker  # a dataset with an "answer" column
    concise = inputs.reward_fns[1]
    assert concise(["q", "q"], ["12", "it is twelve"], max_words=[1, 1]) == [1.0, 0.0]


def test_every_example_config_loads(monkeypatch):
    monkeypatch.chdir(ROOT)
    paths = sorted(ROOT.glob("examples/**/*.yaml"))
    assert len(paths) >= 3
    for path in paths:
        if "rollout_engine: vllm" in path.read_text() and not HAVE_VLLM:
            continue  # a vLLM recipe is refused by name where vLLM is not installed
        load_config(TrainConfig, path.relative_to(ROOT))


def test_import_paths_report_what_is_there(tmp_path):
    with pytest.raises(ConfigError, match="its callables: concise"):
        import_object(str(ROOT / "examples/dataset/rewards.py") + ":nope", "reward function")
    with pytest.raises(ConfigError, match="does not exist"):
        import_object(str(tmp_path / "gone.py") + ":f", "reward function")
    module = tmp_path / "my_rewards_mod.py"
    module.write_text("def score(prompts, completions):\n    return [1.0] * len(completions)\n")
    assert import_object(f"{module}:score", "reward function")(["p"], ["c"]) == [1.0]


def test_an_import_path_with_options_names_a_factory(tmp_path):
    module = tmp_path / "factories.py"
    module.write_text("def bonus(points):\n"
                      "    def reward(prompts, completions):\n"
                      "        return [points] * len(completions)\n"
                      "    return reward\n")
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(4)))
    name = f"{module}:bonus"
    config = TrainConfig(dataset=str(data), reward_functions=(name,), reward_options={name: {"points": 2.0}},
                         eval_size=1)
    assert build_inputs(config).reward_fns[0](["p"], ["c"]) == [2.0]
    with pytest.raises(ConfigError, match="does not take the options"):
        build_inputs(replace(config, reward_options={name: {"pts": 2.0}}))

def test_a_wrong_tool_parser_is_refused_before_any_model_loads():
    config = TrainConfig(env="calculator", tool_parser="hermez")
    with pytest.raises(ConfigError, match="tool_parser: unknown tool parser 'hermez'"):
        build_inputs(config)
    inputs = build_inputs(replace(config, tool_parser="tests.envs.test_tools:parse_calc"))
    assert [t.name for t in inputs.tools] == ["calculator"]


def test_run_and_checkpoint_folders_stand_for_their_newest_policy(tmp_path):
    for step in (1, 12):
        (tmp_path / "checkpoints" / f"step-{step:06d}" / "model").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step-{step:06d}" / "state.json").write_text("{}")
    newest = str(tmp_path / "checkpoints" / "step-000012" / "model")
    for folder in (tmp_path, tmp_path / "checkpoints" / "step-000012"):
        with pytest.warns(UserWarning, match="step-000012 was written before checkpoints carried a manifest"):
            assert resolve_model_path(str(folder)) == newest
    assert resolve_model_path("smollm2-135m") == "smollm2-135m"


def test_a_run_folder_stands_for_its_newest_complete_checkpoint_or_is_refused(tmp_path, capsys):
    args = ["--model", "tiny", "--task", "arithmetic", "--total_steps", "2", "--prompts_per_step", "2",
            "--group_size", "2", "--max_new_tokens", "4", "--eval_size", "2", "--save_every", "1", "--no-progress",
            "--output_dir", str(tmp_path / "run")]
    assert run_main(capsys, "train", *args)[0] == 0
    first, second = (tmp_path / "run" / "checkpoints" / f"step-{s:06d}" for s in (1, 2))
    assert resolve_model_path(str(tmp_path / "run")) == str(second / "model")
    (second / "model" / "model.safetensors").write_bytes(b"cut short")  # a kill mid-write: wrong size
    with pytest.warns(UserWarning, match="skipping .*step-000002: it is incomplete"):
        assert resolve_model_path(str(tmp_path / "run")) == str(first / "model")
    with pytest.raises(CheckpointError, match=r"model.safetensors is damaged.*step-000001, is intact"):
        resolve_model_path(str(second))

    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    code, _, err = run_main(capsys, "eval", "--model", str(tmp_path / "empty"), "--task", "arithmetic")
    assert code == 2 and "run folder without a complete checkpoint" in err and "sentencepiece" not in err


def test_before_after_line():
    assert before_after({"eval/accuracy": 0.1875}, {"eval/accuracy": 0.5}) == "accuracy before=0.188 after=0.500"
    assert before_after({"mean_reward": 0.2}, {"mean_reward": 0.4}) == "mean reward before=0.200 after=0.400"
    assert before_after({}, None) is None


# --------------------------------------------------------------------------- report


def write_run(folder: Path) -> None:
    folder.mkdir(parents=True)
    lines = [{"step": 0, "wall_time": 0.0, "eval/accuracy": 0.25, "eval/len_mean": 3.0}]
    lines += [{"step": s, "wall_time": float(s), "reward/mean": 0.1 * s, "time/step": 1.0} for s in range(1, 6)]
    lines += [{"step": 5, "wall_time": 6.0, "eval/accuracy": 0.75, "eval/len_mean": 2.0}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (folder / "config.yaml").write_text("lr: 1.0e-05\n")


def test_report_command_writes_the_report(tmp_path, capsys):
    write_run(tmp_path / "run")
    code, out, err = run_main(capsys, "report", tmp_path / "run")
    assert code == 0, err
    html = tmp_path / "run" / "report" / "report.html"
    assert f"report: {html}" in out and html.stat().st_size > 0
    assert out.strip().splitlines()[-1] == "accuracy before=0.250 after=0.750"
    code, _, err = run_main(capsys, "report", tmp_path / "run", "--lr", "3")
    assert code == 2 and "no options" in err


# --------------------------------------------------------------------------- end to end on a tiny model


def test_train_then_eval_scores_the_final_checkpoint_as_the_run_did(tmp_path, capsys):
    code, out, err = run_main(capsys, "train", *tiny_run_args(tmp_path))
    assert code == 0, err
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert LAST_LINE.match(out.strip().splitlines()[-1])
    assert (run / "report" / "report.html").exists() and (run / "config.yaml").exists()
    # The resolved config reproduces the run, and eval on it samples exactly as the final evaluation did.
    code, out, err = run_main(capsys, "eval", "--config", run / "config.yaml", "--model", run)
    assert code == 0, err
    table = dict(line.split(maxsplit=1) for line in out.splitlines() if line.startswith(("accuracy", "pass@")))
    assert float(table["accuracy"]) == pytest.approx(summary["eval_after"]["eval/accuracy"], abs=1e-3)
    assert "pass@2" in table
    # A run folder, or one of its checkpoints, alone: evaluated on its run's prompts as above.
    newest = sorted((run / "checkpoints").iterdir())[-1]
    for model in (run, newest):
        code, out, err = run_main(capsys, "eval", "--model", model)
        assert code == 0, err
        assert f"sampling of the run: {run / 'config.yaml'}" in out
        alone = dict(line.split(maxsplit=1) for line in out.splitlines() if line.startswith(("accuracy", "pass@")))
        assert alone == table
    # A run folder from an earlier release, its config.yaml holding a key retired since: evaluated, the key named.
    (run / "config.yaml").write_text((run / "config.yaml").read_text() + "tensorboard: true\n")
    with pytest.warns(UserWarning, match=r"config.yaml: ignoring retired keys tensorboard \(use loggers"):
        code, out, err = run_main(capsys, "eval", "--model", run)
    assert code == 0, err
    assert dict(line.split(maxsplit=1) for line in out.splitlines() if line.startswith(("accuracy", "pass@"))) == table
    # Training again into the same folder would append to its logs: refused, unless replacing it.
    code, _, err = run_main(capsys, "train", *tiny_run_args(tmp_path))
    assert code == 2 and "--resume_from latest" in err and "--overwrite" in err


def test_train_rm_on_a_tiny_model(tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Say a number {i}", "chosen": str(i), "rejected": "no"}) + "\n"
                             for i in range(10)))
    code, out, err = run_main(capsys, "train-rm", "--pairs", pairs, "--model", "tiny", "--output_dir",
                              tmp_path / "rm", "--batch_size", "4")
    assert code == 0, err
    assert (tmp_path / "rm" / "config.json").exists()
    assert "held-out pairs ranked right" in out and "--reward_model" in out
    code, _, err = run_main(capsys, "train-rm", "--pairs", pairs, "--model", "tiny", "--output_dir",
                            tmp_path / "rm", "--batch_size", "4")
    assert code == 0, err  # its own earlier output is replaced
    (tmp_path / "rm" / "README.md").write_text("my notes")
    code, _, err = run_main(capsys, "train-rm", "--pairs", pairs, "--model", "tiny", "--output_dir",
                            tmp_path / "rm", "--batch_size", "4")
    assert code == 2 and "README.md" in err and (tmp_path / "rm" / "README.md").read_text() == "my notes"


@pytest.mark.slow  # a whole demo in a fresh process
def test_demo_quick_end_to_end(tmp_path):
    """What a newcomer runs: a subprocess, under a minute, ending with the before/after line."""
    out_dir = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "grouprl", "demo", "--quick", "--output_dir", str(out_dir),
                           "--no-progress"], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    match = LAST_LINE.match(lines[-1])
    assert match, lines[-5:]
    before, after = map(float, match.groups())
    assert after > before + 0.2  # the quick task is trivially learnable: the numbers must visibly move
    report = out_dir / "report" / "report.html"
    assert f"report: {report}" in proc.stdout and report.stat().st_size > 0
    assert any((out_dir / "report").glob("*.png"))
