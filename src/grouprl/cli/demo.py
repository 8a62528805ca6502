"""The settings of ``grouprl demo`` (``--agent``, ``--quick``) and the quick demo's reward: ordinary train configs,
so a demo's ``config.yaml`` reproduces it with ``grouprl train --config``."""

from __future__ import annotations

from typing import Any

DEMO: dict[str, Any] = {
    "model": "smollm2-135m",
    "task": "arithmetic",  # one-digit + and -: the base model is sometimes right, so groups disagree
    "prompts_per_step": 4,
    "group_size": 8,
    "max_new_tokens": 12,  # "2 + 4 = 6" fits; a rambling answer is cut (and earns nothing: its last number is wrong)
    "total_steps": 12,
    "lr": 2e-5,  # large for RL fine-tuning, so a few steps move the policy
    "beta": 0.04,
    "eval_size": 32,
    "eval_samples": 4,  # less noisy than one
    "eval_temperature": 1.0,
    "log_completions_every": 2,
    "output_dir": "runs/demo",
}
"""SmolLM2-135M-Instruct on one-digit arithmetic, sized for a 2-core CPU."""

AGENT_DEMO: dict[str, Any] = {
    "model": "smollm2-135m",
    "env": "guess-number",  # 1 to 8 in 3 guesses
    "prompts_per_step": 4,
    "group_size": 8,
    "max_new_tokens": 12,  # per turn: a guess is a few tokens; a rambling turn is cut and costs its guess
    "max_turns": 3,
    "total_steps": 40,
    "lr": 2e-5,
    "beta": 0.0,  # no reference pass: a few steps at this lr stay near the start
    "eval_size": 32,
    "eval_samples": 4,
    "eval_temperature": 1.0,
    "eval_every": 10,
    "log_completions_every": 5,
    "output_dir": "runs/demo-agent",
}
"""SmolLM2-135M-Instruct learns the number-guessing game in a multi-turn conversation."""

QUICK_DEMO: dict[str, Any] = {
    "model": "tiny",
    "task": "arithmetic",  # only for its prompts: the reward below ignores the answer
    "reward_functions": ["grouprl.cli.demo:digit_share"],
    "accuracy_fn": "grouprl.cli.demo:only_digits",
    "prompts_per_step": 4,
    "group_size": 8,
    "max_new_tokens": 4,
    "total_steps": 16,
    "lr": 1e-2,  # a random 2-layer model tolerates (and needs) a large step
    "beta": 0.0,
    "eval_size": 16,
    "eval_samples": 4,
    "eval_temperature": 1.0,
    "log_completions_every": 5,
    "print_completions": 0,
    "num_threads": 1,  # a 64-wide model gains nothing from two
    "output_dir": "runs/demo-quick",
}
"""A random 2-layer model learns to answer in digits only: the whole pipeline in under a minute."""

QUICK_DEMO_NOTE = ("quick demo: a random 2-layer model learns to reply with digits only (reward: share of digit "
                   "characters; accuracy: share of held-out completions made only of digits).")


def agent_demo_note(settings: dict[str, Any]) -> str:
    return (f"agent demo: {settings['model']} plays {settings['env']} (several turns, told higher or lower after each "
            f"guess) with GRPO: {settings['total_steps']} steps of {settings['prompts_per_step']} games x "
            f"{settings['group_size']} trajectories; success is the share of won games among "
            f"{settings['eval_samples']} plays of each of {settings['eval_size']} held-out games.")


def demo_note(settings: dict[str, Any]) -> str:
    return (f"demo: {settings['model']} learns one-digit arithmetic with GRPO: {settings['total_steps']} steps of "
            f"{settings['prompts_per_step']} prompts x {settings['group_size']} samples; accuracy is the share of "
            f"right answers among {settings['eval_samples']} samples for each of {settings['eval_size']} held-out "
            "problems.")


def digit_share(prompts: list[Any], completions: list[str], **_: Any) -> list[float]:
    """Share of the completion's non-space characters that are digits (0 for an empty one).

    >>> digit_share([None, None, None], ["12", "a1", ""])
    [1.0, 0.5, 0.0]
    """
    out = []
    for text in completions:
        chars = [ch for ch in text if not ch.isspace()]
        out.append(sum(ch.isdigit() for ch in chars) / len(chars) if chars else 0.0)
    return out


def only_digits(completion: str, row: dict[str, Any]) -> bool:
    """True for a non-empty completion made only of ASCII digits (surrounding spaces allowed).

    >>> only_digits(" 42 ", {}), only_digits("4a", {}), only_digits("", {})
    (True, False, False)
    """
    text = completion.strip()
    return bool(text) and all("0" <= ch <= "9" for ch in text)
