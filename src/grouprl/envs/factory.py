"""Environments by name: a built-in, an import path (``my_module:MyEnv``, whose objects have ``reset`` and
``step``) or a hub's, by a prefix of :data:`HUBS` (``gem:game:GuessTheNumber-v0-easy``, ``openenv:module:Class``,
``openenv+http://host:port``, ``verifiers:module:attr``)."""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grouprl.envs import calculator, guess_number, openenv_env, verifiers_env  # noqa: F401 - built-ins register
from grouprl.envs.base import ENVIRONMENTS, TextEnv
from grouprl.envs.tools import Tool
from grouprl.errors import ConfigError
from grouprl.registry import Registry, import_object


@dataclass(frozen=True)
class Hub:
    """Environments reached by a prefix of ``env``: the module they need, the extra that installs it, and
    ``resolve(the spec after the prefix's colon) -> factory (**options) -> TextEnv``."""

    module: str
    extra: str
    resolve: Callable[[str], Callable[..., TextEnv]]


HUBS: Registry[Hub] = Registry("environment hub")  # prefix (``env`` up to its first colon) -> Hub


class GemEnv:
    """A GEM environment in the text-environment protocol: each observation followed by GEM's hint
    (``info["suffix"]``), an end on a positive reward a success (GEM games reward only a win)."""

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
    import gem

    try:
        return GemEnv(gem.make(env_id, **options))
    except Exception as e:  # noqa: BLE001 - GEM raises several kinds for an unknown id
        raise ConfigError(f"env 'gem:{env_id}': gem.make failed with {type(e).__name__}: {e}") from e


HUBS.register("gem", Hub("gem", "envs", lambda rest: functools.partial(make_gem, rest)))
HUBS.register("openenv", Hub("openenv", "openenv", openenv_env.in_process))
HUBS.register("openenv+http", Hub("openenv", "openenv", lambda rest: openenv_env.by_url("http:" + rest)))
HUBS.register("openenv+https", Hub("openenv", "openenv", lambda rest: openenv_env.by_url("https:" + rest)))
HUBS.register("verifiers", Hub("verifiers", "verifiers", verifiers_env.TasksetEnvs))


def hub_problem(spec: str) -> str | None:
    """Why ``spec``, when a hub's prefix starts it, cannot be made here (its package is missing); else None."""
    prefix = spec.partition(":")[0]
    hub = HUBS.get(prefix) if prefix in HUBS else None
    if hub is None or importlib.util.find_spec(hub.module) is not None:
        return None
    return f"env={spec!r} needs {hub.module}, which is not installed: pip install 'grouprl[{hub.extra}]'"


def resolve_env(spec: str) -> Callable[..., TextEnv]:
    """The factory ``(**options) -> environment`` that ``spec`` names."""
    prefix, _, rest = spec.partition(":")
    if prefix in HUBS:
        problem = hub_problem(spec)
        if problem:
            raise ConfigError(problem)
        return HUBS.get(prefix).resolve(rest)
    if ":" in spec:
        factory = import_object(spec, "env")
        if not callable(factory):
            raise ConfigError(f"env {spec!r} is a {type(factory).__name__}, not a class or factory")
        return factory
    return ENVIRONMENTS.get(spec)


def make_env_factory(spec: str, options: dict[str, Any] | None = None) -> Callable[[], TextEnv]:
    """A factory of fresh environments for ``spec`` with ``options``; one is made at once, so bad names, options
    or objects fail here."""
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


def env_tools(factory: Callable[[], TextEnv]) -> list[Tool]:
    """The tools an environment brings (its ``tools``: functions or :class:`~grouprl.envs.tools.Tool`)."""
    return [t if isinstance(t, Tool) else Tool.of(t) for t in getattr(factory(), "tools", ()) or ()]
