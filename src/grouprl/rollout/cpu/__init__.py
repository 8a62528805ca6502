"""The built-in engine's decode paths that run on a CPU only, each looked up through the rollout format
registry (:data:`grouprl.rollout.formats.FORMATS`) rather than by a format's name:

- :mod:`.layer_loop`: one-token decode steps of Llama-family models as a plain loop over their layers;
- :mod:`.compiled`: that step as one ``torch.compile`` graph (``rollout_compile``);
- :mod:`.weight_only` and :mod:`.bf16_weights`: the ``bf16-weights`` format's products on bf16 copies of the
  weights, with its C++ kernel (:file:`few_rows.cpp`, built by :mod:`.native`).
"""
