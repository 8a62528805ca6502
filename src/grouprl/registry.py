"""Name -> function registries.

Every family of variants (advantage estimators, policy losses, KL estimators, aggregation
modes, tasks, ...) is a :class:`Registry`. Callers look variants up by the name a user wrote in
a config; an unknown name fails with the list of valid ones, so no trainer needs an
``if mode == ...`` chain.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(ValueError):
    """A name that no entry of a registry carries; the message lists the valid names."""


class Registry(Generic[T]):
    """A named mapping from strings to callables (or any objects).

    >>> losses = Registry("loss")
    >>> @losses.register("double")
    ... def double(x):
    ...     return 2 * x
    >>> losses.get("double")(3)
    6
    >>> losses.get("doubel")
    Traceback (most recent call last):
    ...
    grouprl.registry.UnknownNameError: unknown loss 'doubel' (did you mean 'double'?); valid names: double
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None) -> Callable[[T], T] | T:
        """Register ``obj`` under ``name``; without ``obj`` acts as a decorator."""

        def add(item: T) -> T:
            if name in self._entries:
                raise KeyError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = item
            return item

        return add if obj is None else add(obj)

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            close = difflib.get_close_matches(str(name), self._entries, n=3)
            hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}{hint}; valid names: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)
