"""The trainer's side of rollout servers: :class:`~.server_sampler.ServerSampler`, the rollout engine over them; the
HTTP connections and fault handling (:mod:`.pool`) over the servers as the trainer sees them (:mod:`.servers`), a
dropped one coming back (:mod:`.rejoin`); weight hand-over (:mod:`.handover`; broadcast pushes: :mod:`.collective`; the
processes of a torchrun trainer: :mod:`.ranks`); servers started here for a run (:mod:`.local_servers`) or named by the
config (:mod:`.from_config`)."""
