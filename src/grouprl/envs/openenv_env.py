"""OpenEnv environments in the text-environment protocol: an ``Environment`` class in process
(``openenv:module:Class``) or a server's sessions, one per trajectory (``openenv+http://host:port``).

The policy's turn fills the action's one text field; the observation's one text field (else all its fields as
JSON) is the next user turn. A row's columns go to ``reset`` as the keyword arguments it takes. Options
``action_field`` and ``observation_field`` name the fields where there are several; the rest go to the constructor.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any, get_type_hints

from grouprl.errors import ConfigError
from grouprl.registry import import_object

NOT_SHOWN = ("reward", "done", "metadata")  # observation fields the policy does not read


def text_field(schema: dict[str, Any], name: str | None, spec: str) -> str:
    """The field of an action's JSON ``schema`` that the policy's text fills: ``name``, else its one string field."""
    fields = {k: v for k, v in schema.get("properties", {}).items() if k not in NOT_SHOWN}
    if name is not None and name not in fields:
        raise ConfigError(f"env {spec!r}: action_field {name!r} is not a field of its action; its fields: "
                          f"{', '.join(fields) or 'none'}")
    texts = [k for k, v in fields.items() if v.get("type") == "string"]
    if name is None and len(texts) != 1:
        raise ConfigError(f"env {spec!r}: its action has {len(texts)} text fields ({', '.join(texts) or 'none'}; "
                          f"all fields: {', '.join(fields) or 'none'}): set env_options.action_field to the one the "
                          "policy's reply fills")
    field = name or texts[0]
    others = [k for k in schema.get("required", ()) if k != field]
    if others:
        raise ConfigError(f"env {spec!r}: its action also requires {', '.join(others)}, which a text reply cannot fill")
    return field


class OpenEnvText:
    def __init__(self, env: Any, make_action: Callable[[str], Any], observation_field: str | None = None,
                 reset_names: set[str] | None = None, remote: bool = False):
        self.env, self.make_action, self.observation_field = env, make_action, observation_field
        self.reset_names, self.remote = reset_names, remote

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        columns = {k: v for k, v in (options or {}).items()
                   if k != "seed" and (self.reset_names is None or k in self.reset_names)}
        return self._text(self._parts(self.env.reset(seed=seed, **columns))[0]), {}

    def step(self, action: str) -> tuple[str, Any, bool, bool, dict[str, Any]]:
        fields, reward, done, metadata = self._parts(self.env.step(self.make_action(action)))
        if done and self.remote:
            self.env.close()  # the server's session is freed for the next trajectory
        info = {"success": bool(metadata["success"])} if "success" in metadata else {}
        return self._text(fields), 0.0 if reward is None else reward, bool(done), False, info

    @staticmethod
    def _parts(result: Any) -> tuple[dict[str, Any], Any, bool, dict[str, Any]]:
        """``(shown fields, reward, done, metadata)`` of an Observation or a client's StepResult (no metadata)."""
        if hasattr(result, "model_dump"):
            return result.model_dump(exclude=set(NOT_SHOWN)), result.reward, result.done, result.metadata or {}
        return dict(result.observation), result.reward, result.done, {}

    def _text(self, fields: dict[str, Any]) -> Any:
        if self.observation_field is not None:
            if self.observation_field not in fields:
                raise KeyError(f"observation_field {self.observation_field!r} is not in the observation; its fields: "
                               f"{', '.join(fields)}")
            return fields[self.observation_field]
        texts = [v for v in fields.values() if isinstance(v, str)]
        return texts[0] if len(texts) == 1 else json.dumps(fields, default=str)


def in_process(path: str) -> Callable[..., OpenEnvText]:
    """The factory ``(action_field=None, observation_field=None, **constructor options)`` of ``module:Class``."""
    from openenv.core.env_server.interfaces import Environment
    from pydantic import BaseModel

    spec = f"openenv:{path}"
    cls = import_object(path, "env")
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ConfigError(f"env {spec!r} is {cls!r}, not an OpenEnv Environment class")
    action_cls = get_type_hints(cls.step).get("action")
    if not (isinstance(action_cls, type) and issubclass(action_cls, BaseModel)):
        raise ConfigError(f"env {spec!r}: {cls.__name__}.step(action) must be annotated with its Action class, got "
                          f"{action_cls!r}")
    params = inspect.signature(cls.reset).parameters.values()
    names = None if any(p.kind is p.VAR_KEYWORD for p in params) else {p.name for p in params}

    def make(action_field: str | None = None, observation_field: str | None = None, **options: Any) -> OpenEnvText:
        field = text_field(action_cls.model_json_schema(), action_field, spec)
        return OpenEnvText(cls(**options), lambda text: action_cls(**{field: text}), observation_field, names)

    return make


def by_url(url: str) -> Callable[..., OpenEnvText]:
    """The factory ``(action_field=None, observation_field=None)`` of sessions with the server at ``url``."""
    import httpx

    spec = f"openenv+{url}"
    try:
        schema = httpx.get(url.rstrip("/") + "/schema", timeout=10).raise_for_status().json()["action"]
    except Exception as e:  # noqa: BLE001 - unreachable, not an OpenEnv server, or a schema without an action
        raise ConfigError(f"env {spec!r}: the action schema could not be read from {url.rstrip('/')}/schema: "
                          f"{type(e).__name__}: {e}") from e

    def make(action_field: str | None = None, observation_field: str | None = None) -> OpenEnvText:
        from openenv.core.generic_client import GenericEnvClient

        field = text_field(schema, action_field, spec)
        return OpenEnvText(GenericEnvClient(base_url=url).sync(), lambda text: {field: text}, observation_field,
                           remote=True)

    return make
