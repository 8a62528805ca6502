"""What several trainer processes refuse with rollout servers, before anything is loaded."""

from grouprl.trainer.dist.processes import world_size_problems
from tests.helpers.trainer import base_config


def test_several_processes_take_servers_under_ddp_at_any_staleness(tmp_path):
    ok = base_config(tmp_path, prompts_per_step=4, rollout_servers=("127.0.0.1:8000",), engine="ddp")
    assert world_size_problems(ok, 2) == [] and world_size_problems(ok, 1) == []
    fsdp = world_size_problems(base_config(tmp_path, prompts_per_step=4, rollout_servers=2, engine="fsdp"), 2)
    assert len(fsdp) == 1 and fsdp[0].startswith("rollout_servers with several processes needs engine=ddp, not fsdp")
    ahead = world_size_problems(base_config(tmp_path, prompts_per_step=4, rollout_servers=("127.0.0.1:8000",),
                                            engine="ddp", max_staleness=1, rollout_is="token"), 2)
    assert ahead == []  # each process's rollout thread pushes and receives on a group of its own
    # without servers neither rule applies (the in-process engines have their own)
    assert world_size_problems(base_config(tmp_path, prompts_per_step=4, engine="fsdp"), 2) == []
