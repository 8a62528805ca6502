"""The ``grouprl serve`` process: vLLM's :mod:`.app` with grouprl's :mod:`.routes` behind :mod:`.guard`."""
