"""The rollout server process, ``grouprl serve``: vLLM's app (:mod:`.app`) with grouprl's routes (:mod:`.routes`,
:mod:`.leases`, :mod:`.pushes`) behind :mod:`.guard`; :mod:`.parent` ends it with its run."""
