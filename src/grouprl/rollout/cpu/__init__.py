"""The built-in engine's CPU decode paths: the layer loop (:mod:`.layer_loop`), its compiled step (:mod:`.compiled`),
bf16-weights products (:mod:`.weight_only`, :mod:`.bf16_weights`, kernel built by :mod:`.native`)."""
