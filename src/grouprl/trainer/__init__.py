"""The trainer of every language-model algorithm: one step loop (:mod:`.trainer`) composed of a collector, a
baseline (group or critic), an update rule and a process group; algorithms by name in :mod:`.algorithms`."""
