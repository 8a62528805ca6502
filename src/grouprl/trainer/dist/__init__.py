"""Several processes, one model: the process group and its collectives (:mod:`.group`), sharding by
FSDP2 or DDP (:mod:`.sharding`), sharded checkpoints (:mod:`.checkpoint`), and the trainer's process
component over all of them (:class:`.processes.Processes`). Imported only by multi-process runs."""
