"""Each step on the console: one plain line per step when the output is not a terminal (a file, a
pipe, a scheduler's log), a live rich bar when it is."""

from __future__ import annotations

import io
import re

from rich.console import Console

from grouprl.run.logs import Progress

STEP_1 = {"reward/mean": 0.5, "policy/kl": 0.01, "throughput/tokens_per_s": 120.0, "time/step": 2.5}
STEP_2 = {"reward/mean": 0.25, "env/success": 0.375, "env/turns_mean": 2.25, "throughput/tokens_per_s": 99.6,
          "time/step": 0.125}


def test_without_a_terminal_each_step_is_one_plain_line(capsys):
    bar = Progress(total=3, start=0, enabled=True)  # pytest's captured stdout is not a terminal
    bar.update(1, STEP_1)
    assert capsys.readouterr().out == "grpo step 1/3  reward 0.500  kl 0.0100  2.50 s/step  120 tok/s\n"
    bar.update(2, STEP_2, alert="entropy falling")
    bar.close()
    assert capsys.readouterr().out == ("grpo step 2/3  reward 0.250  kl -  0.12 s/step  100 tok/s  success 0.38  "
                                       "turns 2.2  ! entropy falling\n")
    assert bar.bar is None


def test_a_line_is_never_cut_at_the_consoles_width(capsys):
    bar = Progress(total=1000, start=0, enabled=True, label="ppo CartPole-v1-with-a-long-name" + "x" * 80,
                   rate=("throughput/env_steps_per_s", "steps/s"))
    bar.update(512, {"reward/mean": 21.0, "throughput/env_steps_per_s": 4096.0, "time/step": 0.5})
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and len(out) > 120 and out.endswith("step 512/1000  reward 21.000  kl -  "
                                                                     "0.50 s/step  4096 steps/s\n")


def test_on_a_terminal_the_bar_shows_reward_kl_and_speed_and_no_lines():
    screen = io.StringIO()
    bar = Progress(total=3, start=0, enabled=True, console=Console(file=screen, force_terminal=True, width=160))
    try:
        assert bar.bar is not None
        bar.update(1, STEP_1)
        fields = bar.bar.tasks[0].fields
        assert (fields["reward"], fields["kl"], fields["tps"], fields["extra"]) == ("0.500", "0.0100", "120", "")
        bar.update(2, STEP_2, alert="entropy falling")
        fields = bar.bar.tasks[0].fields
        assert fields["extra"] == "  success 0.38  turns 2.2  [yellow]! entropy falling[/yellow]"
        assert fields["kl"] == "-" and bar.bar.tasks[0].completed == 2
        bar.bar.refresh()
    finally:
        bar.close()
    drawn = screen.getvalue()
    assert "reward 0.250" in drawn and "100 tok/s" in drawn and "2/3" in drawn
    assert "\x1b[" in drawn, "a terminal gets rich's escape codes"
    assert "grpo step" not in drawn, "no plain lines on a terminal"


def test_disabled_it_prints_nothing(capsys):
    bar = Progress(total=3, start=0, enabled=False)
    bar.update(1, STEP_1)
    bar.print("[bold]hello[/bold]")
    bar.sample(1, 0.5, "text")
    bar.close()
    assert capsys.readouterr().out == ""


def test_a_sampled_completion_is_printed_as_text_never_as_markup(capsys):
    """Model-written text may hold rich's brackets: '[/bold]' closing nothing would raise MarkupError."""
    hostile = "[/bold] [red]x[/red] [link=file:///etc/passwd]y\\"
    bar = Progress(total=3, start=0, enabled=True)
    bar.sample(4, 0.25, hostile)
    bar.sample(4, None, "z" * 300)  # a row no reward function scored, and a long completion
    assert capsys.readouterr().out == f"step 4 reward 0.250 {hostile!r}\nstep 4 reward - {'z' * 200!r}\n"
    screen = io.StringIO()
    on_terminal = Progress(total=3, start=0, enabled=True, console=Console(file=screen, force_terminal=True))
    try:
        on_terminal.sample(4, 0.25, hostile)
    finally:
        on_terminal.close()
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())  # without the escape codes
    assert f"step 4 reward 0.250 {hostile!r}" in shown
