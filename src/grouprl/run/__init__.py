"""What every trainer's run shares: the loop (:mod:`.loop`), the run folder (:mod:`.folder`), logs
(:mod:`.logs`), checkpoints (:mod:`.checkpoint_files`), crash-safe files (:mod:`.files`) and the optimizer."""
