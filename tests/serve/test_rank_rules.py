"""What several trainer processes refuse with rollout servers, before anything is loaded."""

from grouprl.trainer.dist.processes import world_size_problems
from tests.helpers.trainer import base_config


def test_several_processes_take_servers_under_ddp_and_fsdp_at_any_staleness(tmp_path):
    for engine in ("ddp", "fsdp"):
        ok = base_config(tmp_path, prompts_per_step=4, rollout_servers=("127.0.0.1:8000",), engine=engine)
        assert world_size_problems(ok, 2) == [] and world_size_problems(ok, 1) == []
        local = base_config(tmp_path, prompts_per_step=4, rollout_servers=2, engine=engine)
        assert world_size_problems(local, 2) == []
        ahead = world_size_problems(base_config(tmp_path, prompts_per_step=4, rollout_servers=("127.0.0.1:8000",),
                                                engine=engine, max_staleness=1, rollout_is="token"), 2)
        assert ahead == []  # each process's rollout thread pushes and receives on a group of its own
    # without servers neither rule applies (the in-process engines have their own)
    assert world_size_problems(base_config(tmp_path, prompts_per_step=4, engine="fsdp"), 2) == []


def test_a_server_process_0_dropped_is_dropped_on_every_process(monkeypatch):
    """Process 1's side of the push broadcast: what process 0 says of each server, taken over."""
    import warnings

    from grouprl.serve.client import ranks as ranks_module
    from grouprl.serve.client.pool import ServerPool

    pool = ServerPool(["127.0.0.1:8001", "127.0.0.1:8002"], timeout=5)
    fine, hung = pool.servers

    def broadcast(news, src, group):  # process 0: the first server at version 3, the second dropped
        news[0] = (3, [(fine.address, True, "", 3, "policy-3"), (hung.address, False, "hung", 2, None)], None, False)

    monkeypatch.setattr(ranks_module.dist, "broadcast_object_list", broadcast)
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            assert ranks_module.Ranks(1, 2).after_push(pool, None, None) == (3, False)
        assert fine.alive and (fine.version, fine.adapter) == (3, "policy-3")
        assert not hung.alive and hung.why == "process 0 dropped it: hung"
        assert [str(w.message) for w in said] == [f"rollout server {hung.address} dropped: process 0 dropped it: hung; "
                                                  f"going on with 1 of 2 servers ({fine.address})"]
    finally:
        pool.close()


def test_every_process_names_the_adapter_process_0_loaded_in_its_requests(monkeypatch):
    """With LoRA a request names the adapter its server holds (each push loads one under a new name): the other
    processes take the names from process 0's broadcast, or they would sample from the base or an older one."""
    from grouprl.serve.client import ranks as ranks_module
    from grouprl.serve.client.pool import ServerPool

    pool = ServerPool(["127.0.0.1:8001", "127.0.0.1:8002"], timeout=5)
    first, second = pool.servers
    first.version, first.adapter = 1, "policy-1"

    def broadcast(news, src, group):  # process 0 pushed version 2 to both
        news[0] = (2, [(first.address, True, "", 2, "policy-2"), (second.address, True, "", 2, "policy-2")], None,
                   False)

    monkeypatch.setattr(ranks_module.dist, "broadcast_object_list", broadcast)
    try:
        assert ranks_module.Ranks(1, 2).after_push(pool, None, None) == (2, False)
        assert [(s.alive, s.version, s.adapter) for s in pool.servers] == [(True, 2, "policy-2")] * 2
    finally:
        pool.close()
