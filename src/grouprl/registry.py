"""Name -> object registries (an unknown name fails with the valid ones, so no ``if mode == ...`` chains), and a
user's own objects named ``module:attr`` or ``path/to/file.py:attr`` (:func:`import_object`)."""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

from grouprl.errors import ConfigError

T = TypeVar("T")


class UnknownNameError(ValueError):
    """A name no entry of a registry carries; the message lists the valid names."""


class Registry(Generic[T]):
    """A named mapping of strings to objects.

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
        """Register ``obj`` under ``name``; without ``obj``, a decorator."""

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
            raise UnknownNameError(f"unknown {self.kind} {name!r}{hint}; valid names: {', '.join(self.names())}") \
                from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)


def import_object(path: str, what: str) -> Any:
    """The object named by ``module:attr`` or ``path/to/file.py:attr``; a dotted module is looked up from the
    current folder first, as ``python -m`` would (the console script does not put it on ``sys.path``)."""
    module_name, _, attr = path.rpartition(":")
    try:
        module = _import_file(module_name) if module_name.endswith(".py") else _import_module(module_name)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure while importing user code is reported with its cause
        raise ConfigError(f"{what} {path!r}: importing {module_name!r} failed with {type(e).__name__}: {e}") from e
    if not hasattr(module, attr):
        public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise ConfigError(f"{what} {path!r}: {module_name!r} has no attribute {attr!r}; "
                          f"its callables: {', '.join(public) or 'none'}")
    return getattr(module, attr)


def _import_file(filename: str) -> Any:
    file = Path(filename).expanduser()
    if not file.is_file():
        raise ConfigError(f"{filename!r} does not exist (import paths are file.py:function or module:function)")
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:10]
    name = f"grouprl_user_{file.stem}_{digest}"  # one module per file, however it is spelt
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import_module(name: str) -> Any:
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    finally:
        if added:
            sys.path.remove(cwd)
