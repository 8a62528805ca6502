"""Text environments for agents: the protocol (:mod:`.base`), tools (:mod:`.tools`), one trajectory's side of the
conversation (:mod:`.episode`), environments by name and the hubs' adapters (:mod:`.factory`)."""

from grouprl.envs.base import ENVIRONMENTS, Message, Observation, TextEnv, as_messages, transcript
from grouprl.envs.episode import Episode
from grouprl.envs.factory import make_env_factory
from grouprl.envs.tools import TOOL_PARSERS, Tool, load_tools

__all__ = ["ENVIRONMENTS", "Episode", "Message", "Observation", "TOOL_PARSERS", "TextEnv", "Tool", "as_messages",
           "load_tools", "make_env_factory", "transcript"]
