"""What every trainer's run shares, language model or classic control: the loop around ``step()``
(:mod:`.loop`), the run folder and its claim (:mod:`.folder`), logs and the progress bar
(:mod:`.logs`), checkpoints (:mod:`.checkpoint`), crash-safe files (:mod:`.files`), the optimizer
and its schedule (:mod:`.optim`)."""
