"""One trajectory's side: resets, environment steps and their rewards, tool turns, budgets of tool
calls, failures, and the state keys of each turn."""

from __future__ import annotations

import pytest

from grouprl.envs import Episode, Tool, make_env_factory
from grouprl.envs.calculator import Calculator, calculator
from grouprl.envs.guess_number import GuessNumber
from grouprl.errors import ConfigError
from grouprl.registry import UnknownNameError


class Counter:
    """Counts to three: each step pays 0.5, the third ends; step 2 raises when told to."""

    def __init__(self, fail_at: int | None = None):
        self.fail_at, self.n = fail_at, 0

    def reset(self, *, seed=None, options=None):
        self.n = 0
        return f"start {seed} {options}", {}

    def step(self, action):
        self.n += 1
        if self.n == self.fail_at:
            raise RuntimeError("broken")
        return f"count {self.n}", 0.5, self.n == 3, False, {"success": self.n == 3}


def test_steps_sum_their_rewards_and_the_end_is_none():
    ep = Episode(Counter(), seed=4, options={"row": 1})
    assert ep.start() == [{"role": "user", "content": "start 4 {'row': 1}"}]
    assert ep.respond("a") == [{"role": "user", "content": "count 1"}]
    assert ep.respond("b") == [{"role": "user", "content": "count 2"}]
    assert ep.respond("c") is None
    assert (ep.return_, ep.step_rewards, ep.success, ep.end_reason) == (1.5, [0.5, 0.5, 0.5], True, "env")
    assert [m["role"] for m in ep.messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert ep.final_answer == "c"
    assert ep.state_keys == ["start 4 {'row': 1}", "count 1", "count 2"]


def test_an_environment_that_raises_ends_the_trajectory_as_an_error():
    ep = Episode(Counter(fail_at=2))
    ep.start()
    ep.respond("a")
    assert ep.respond("b") is None
    assert ep.end_reason == "error"
    assert ep.error == "environment Counter (seed None) failed at a step: RuntimeError: broken"


def test_tool_turns_are_answered_by_tools_and_the_environment_does_not_step():
    env = Calculator(worked_example=False)
    ep = Episode(env, [Tool.of(calculator)], seed=0, max_tool_calls=2)
    question = ep.start()[0]["content"]
    a, b = question.split("What is ")[1].split("?")[0].split(" + ")
    call = f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{a} + {b}"}}}}</tool_call>'
    assert ep.respond(call) == [{"role": "tool", "name": "calculator", "content": str(int(a) + int(b))}]
    assert ep.respond("<tool_call>{bad</tool_call>")[0]["content"].startswith("error: the tool call is not valid")
    assert (ep.tool_calls, ep.tool_errors, ep.step_rewards) == (2, 1, [0.0, 0.0])
    # the budget of tool calls is spent: the next call goes to the environment as an answer
    assert ep.respond(call) is None and ep.success is False and ep.tool_calls == 2
    ep2 = Episode(Calculator(worked_example=False), [Tool.of(calculator)], seed=0)
    ep2.start()
    assert ep2.respond(f"It is {int(a) + int(b)}.") is None
    assert (ep2.return_, ep2.success) == (1.0, True)


def test_the_calculator_opens_with_a_worked_example_of_another_sum():
    ep = Episode(Calculator(), [Tool.of(calculator)], seed=5)
    opening = ep.start()
    assert [m["role"] for m in opening] == ["user", "assistant", "tool", "assistant", "user"] and ep.opening == 5
    example, asked = opening[0]["content"], opening[-1]["content"]
    ea, eb = (int(x) for x in example.split("What is ")[1].split("?")[0].split(" + "))
    a, b = (int(x) for x in asked.split("What is ")[1].split("?")[0].split(" + "))
    assert (ea, eb) != (a, b) and opening[1]["content"] in example  # the example's call is the one it shows
    assert opening[2]["content"] == opening[3]["content"] == str(ea + eb)
    assert Calculator().reset(seed=5) == Calculator().reset(seed=5)
    # the reward is for the asked sum, not the example's
    assert ep.respond(str(ea + eb)) is None and ep.return_ == 0.0
    ep = Episode(Calculator(), [Tool.of(calculator)], seed=5)
    ep.start()
    assert ep.respond(str(a + b)) is None and (ep.return_, ep.final_answer) == (1.0, str(a + b))


def test_guess_number_answers_higher_or_lower_and_keys_the_interval():
    env = GuessNumber(low=1, high=8, max_guesses=3)
    _, info = env.reset(seed=0)
    target = env.target
    assert info["state_key"] == (1, 8, 3)
    low_guess = 1 if target > 1 else 8
    text, reward, done, _, info = env.step(f"I say {low_guess}")
    assert reward == 0.0 and not done
    assert text.startswith("Higher" if low_guess < target else "Lower")
    assert info["state_key"] == ((2, 8, 2) if low_guess < target else (1, 7, 2))
    text, reward, done, _, info = env.step(f"\\boxed{{{target}}} (or 3)")
    assert (reward, done, info["success"]) == (1.0, True, True)


def test_guess_number_ends_after_its_guesses_without_a_number():
    env = GuessNumber(max_guesses=2)
    env.reset(seed=1)
    assert env.step("hmm")[0].startswith("Reply with just a number")
    _, reward, done, _, info = env.step("still no")
    assert (reward, done, info["success"]) == (0.0, True, False)


def test_the_same_seed_resets_the_same_game():
    first, second = GuessNumber(), GuessNumber()
    assert first.reset(seed=11) == second.reset(seed=11) and first.target == second.target


def test_environments_by_name_import_path_and_refusals():
    assert isinstance(make_env_factory("guess-number", {"high": 16})(), GuessNumber)
    assert isinstance(make_env_factory("tests.envs.test_episode:Counter")(), Counter)
    with pytest.raises(UnknownNameError, match="did you mean 'guess-number'"):
        make_env_factory("guess-numbr")
    with pytest.raises(ConfigError, match="could not be made.*max_guesses"):
        make_env_factory("guess-number", {"max_guesses": 0})
    with pytest.raises(ConfigError, match="has no reset or step"):
        make_env_factory("tests.envs.test_episode:NotAnEnv")


class NotAnEnv:
    pass
