"""The trainer of every language-model algorithm: one step loop (:mod:`.trainer`) composed of a
rollout collector (:mod:`.collect`), a baseline (the group, :mod:`.advantages`, or a critic,
:mod:`.critic`), an update rule (:mod:`.update`, :mod:`.trust_region`) and a process group
(:mod:`.one_process`, :mod:`.dist`); the algorithms by name (:mod:`.algorithms`) and the config
(:mod:`.config`, checked by :mod:`.checks`)."""
