"""The trainer's side: the engine (:mod:`.server_sampler`), connections and membership (:mod:`.pool`, :mod:`.servers`),
weight hand-over (:mod:`.handover`, :mod:`.collective`, :mod:`.ranks`)."""
