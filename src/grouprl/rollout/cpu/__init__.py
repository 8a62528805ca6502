"""The built-in engine's CPU-only decode paths, looked up through :data:`grouprl.rollout.formats.FORMATS`: the layer
loop (:mod:`.layer_loop`), its compiled step (:mod:`.compiled`), and bf16-weights products (:mod:`.weight_only`,
:mod:`.bf16_weights`, kernel built by :mod:`.native`).
"""
