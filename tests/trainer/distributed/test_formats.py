"""dtype auto over two processes: the first process decides the formats and the other receives them, so both
compute alike even where the second would have decided otherwise, and the run equals one process's."""

import json

import pytest
import torch
import yaml

from tests.helpers.dist import SETTINGS, build, full_weights, start_group
from tests.helpers.formats_group import SETTINGS as AUTO
from tests.helpers.formats_group import formats_group

TOLERANCE = 1e-5
"""As the other two-process comparisons: 1% of one Adam step at lr 1e-3, in fp32."""


@pytest.mark.slow
def test_two_processes_share_the_first_ones_formats_and_train_like_one(tmp_path):
    single = build(tmp_path / "single", "auto", **AUTO)
    single.train()
    want = full_weights(single)
    start_group(formats_group, tmp_path)
    ranks = [torch.load(tmp_path / f"auto-rank{r}.pt", weights_only=False) for r in (0, 1)]
    for r in ranks:
        assert "error" not in r, r.get("trace")
    # process 1 was told it is another kind of machine: had it decided, its rule would differ
    assert ranks[0]["formats"] == ranks[1]["formats"] == single.formats
    assert ranks[1]["config_dtype"] == single.formats.train
    run = tmp_path / "auto" / "run"
    written = yaml.safe_load((run / "config.yaml").read_text())
    assert (written["dtype"], written["ref_dtype"], written["rollout_dtype"]) == \
        (single.formats.train, single.formats.reference, single.formats.rollout)
    assert json.loads((run / "summary.json").read_text())["setup"]["formats"] == single.formats.describe()
    # bf16 training (an AMX or Zen 4 machine) sums in another order on two processes: up to a whole Adam step
    # (lr) of each of the 3 steps may differ where a gradient is near 0
    tolerance = TOLERANCE if single.formats.train == "fp32" else SETTINGS["lr"] * SETTINGS["total_steps"]
    for key, expected in want.items():
        diff = float((ranks[0]["weights"][key] - expected).abs().max())
        assert diff <= tolerance, f"{key}: two processes differ from one by {diff:.3g} (> {tolerance:.3g})"
