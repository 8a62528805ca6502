"""Guess the number in ``[low, high]``: each turn is a guess answered "higher" or "lower", until it is found
(reward 1) or ``max_guesses`` are spent (0); a turn's state key is the open interval and the guesses left."""

from __future__ import annotations

import random
from typing import Any

from grouprl.envs.base import ENVIRONMENTS
from grouprl.envs.last_integer import last_integer


class GuessNumber:
    def __init__(self, low: int = 1, high: int = 8, max_guesses: int = 3):
        if not low < high or max_guesses < 1:
            raise ValueError(f"guess-number needs low < high and max_guesses >= 1, got {low}, {high}, {max_guesses}")
        self.low, self.high, self.max_guesses = low, high, max_guesses
        self.target, self.used, self.lo, self.hi = low, 0, low, high

    def _key(self) -> tuple[int, int, int]:
        return self.lo, self.hi, self.max_guesses - self.used

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self.target = random.Random(seed).randint(self.low, self.high)
        self.used, self.lo, self.hi = 0, self.low, self.high
        text = (f"I am thinking of a whole number from {self.low} to {self.high}. Guess it: reply with just the "
                f"number. You have {self.max_guesses} guesses, and after each one I say whether my number is "
                f"higher or lower.")
        return text, {"state_key": self._key()}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.used += 1
        guess = last_integer(action)
        if guess == self.target:
            return f"Yes, it is {guess}.", 1.0, True, False, {"success": True}
        left = self.max_guesses - self.used
        if left == 0:
            return f"No guesses left; it was {self.target}.", 0.0, True, False, {"success": False}
        if guess is None:
            text = f"Reply with just a number from {self.low} to {self.high}."
        elif guess < self.target:
            self.lo = max(self.lo, guess + 1)
            text = f"Higher than {guess}."
        else:
            self.hi = min(self.hi, guess - 1)
            text = f"Lower than {guess}."
        return f"{text} {left} guess{'es' if left > 1 else ''} left.", 0.0, False, False, {"state_key": self._key()}


ENVIRONMENTS.register("guess-number", GuessNumber)
