"""Environments by name: the built-ins (:data:`~grouprl.envs.base.ENVIRONMENTS`), an import path
(``my_module:MyEnv``: any class or factory whose objects have ``reset`` and ``step``) or a GEM id
(``gem:game:GuessTheNumber-v0-easy``, made by ``gem.make``; ``pip install 'grouprl[envs]'``)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from grouprl.envs import calculator, guess_number  # noqa: F401 - registers the built-in environments
from grouprl.envs.base import ENVIRONMENTS, TextEnv
from grouprl.errors import ConfigError
from grouprl.registry import import_object

GEM_PREFIX = "gem:"


class GemEnv:
    """A GEM environment in the text-environment protocol: ``options`` passed only where its ``reset``
    takes them, each observation followed by the hint GEM keeps in ``info["suffix"]``, and a
    trajectory that ends on a positive reward counted as a success (GEM games reward only a win)."""

    def __init__(self, env: Any):
        self.env = env
        self._takes_options = "options" in inspect.signature(env.reset).parameters

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        if self._takes_options:
            observation, info = self.env.reset(seed=seed, options=options)
        else:
            observation, info = self.env.reset(seed=seed)
        return observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info or {})
        suffix = info.get("suffix")
        if suffix and not (terminated or truncated):
            observation = f"{observation}\n{suffix}"
        if (terminated or truncated) and "success" not in info:
            info["success"] = float(reward) > 0
        return observation, float(reward), bool(terminated), bool(truncated), info


def make_gem(env_id: str, **options: Any) -> GemEnv:
    try:
        import gem
    except ImportError as e:
        raise ConfigError(f"env 'gem:{env_id}' needs GEM: pip install 'grouprl[envs]'") from e
    try:
        return GemEnv(gem.make(env_id, **options))
    except Exception as e:  # noqa: BLE001 - GEM raises several kinds for an unknown id
        raise ConfigError(f"env 'gem:{env_id}': gem.make failed with {type(e).__name__}: {e}") from e


def resolve_env(spec: str) -> Callable[..., TextEnv]:
    """The factory ``(**options) -> environment`` that ``spec`` names."""
    if spec.startswith(GEM_PREFIX):
        return functools.partial(make_gem, spec[len(GEM_PREFIX):])
    if ":" in spec:
        factory = import_object(spec, "env")
        if not callable(factory):
            raise ConfigError(f"env {spec!r} is a {type(factory).__name__}, not a class or factory")
        return factory
    return ENVIRONMENTS.get(spec)


def make_env_factory(spec: str, options: dict[str, Any] | None = None) -> Callable[[], TextEnv]:
    """A factory of fresh environments for ``spec`` with ``options``; one is made at once, so a bad
    name, bad options or an object without ``reset``/``step`` fail here, naming the environment."""
    factory = resolve_env(spec)
    make = functools.partial(factory, **(options or {}))
    try:
        probe = make()
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the user's constructor is reported with its cause
        raise ConfigError(f"env {spec!r} with options {options or {}} could not be made: {type(e).__name__}: {e}") \
            from e
    missing = [m for m in ("reset", "step") if not callable(getattr(probe, m, None))]
    if missing:
        raise ConfigError(f"env {spec!r} makes a {type(probe).__name__}, which has no {' or '.join(missing)}: an "
                          "environment needs reset(*, seed, options) and step(action)")
    return make


def env_tools(factory: Callable[[], TextEnv]) -> list[Callable[..., Any]]:
    """The tools an environment brings (its ``tools`` attribute), if any."""
    return list(getattr(factory(), "tools", ()) or ())
