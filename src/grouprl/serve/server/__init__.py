"""The rollout server process, ``grouprl serve``: vLLM's HTTP app (:mod:`.app`) with grouprl's routes (:mod:`.routes`:
versions, weight pushes, collective transfers held under leases, :mod:`.leases`), behind :mod:`.guard` (the token,
request limits); :mod:`.pushes` checks a push before vLLM sees it; :mod:`.parent` ends a server with the run that
started it."""
