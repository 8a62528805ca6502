"""Update rules by name (an algorithm's ``update``): each takes ``(config, passes, processes, critic)``
and offers ``update(data, step, beta) -> metrics`` and ``checkpoint_parts()``."""

from __future__ import annotations

from grouprl.registry import Registry
from grouprl.trainer.trust_region import TrustRegionUpdate
from grouprl.trainer.update import ClippedSurrogateUpdate

UPDATE_RULES: Registry[type] = Registry("update rule")
UPDATE_RULES.register("clipped", ClippedSurrogateUpdate)
UPDATE_RULES.register("trust-region", TrustRegionUpdate)
