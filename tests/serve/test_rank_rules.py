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


def test_a_server_process_0_readmitted_rejoins_on_every_process_and_one_it_dropped_is_dropped(monkeypatch):
    """Process 1's side of the push broadcast: what process 0 says of each server, taken over."""
    import warnings

    import pytest

    from grouprl.serve.client import ranks as ranks_module
    from grouprl.serve.client.pool import ServerPool
    from grouprl.serve.client.servers import ServerFailure

    pool = ServerPool(["127.0.0.1:8001", "127.0.0.1:8002"], timeout=5)
    back, fine = pool.servers
    with pytest.warns(UserWarning):
        pool.drop(ServerFailure(back, "POST /inference/v1/generate failed: ConnectError"))

    def broadcast(news, src, group):  # process 0: the first server back with version 3, the second dropped
        news[0] = (3, [(back.address, True, "", 3, "policy-3", False), (fine.address, False, "hung", 2, None, False)],
                   None, False)

    monkeypatch.setattr(ranks_module.dist, "broadcast_object_list", broadcast)
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            assert ranks_module.Ranks(1, 2).after_push(pool, None, None) == (3, False)
        assert back.alive and (back.version, back.adapter, back.why) == (3, "policy-3", "")
        assert not fine.alive and fine.why == "process 0 dropped it: hung"
        messages = [str(w.message) for w in said]
        assert any(m.startswith(f"rollout server {back.address} is back (dropped earlier: POST") for m in messages)
        assert any(m.startswith(f"rollout server {fine.address} dropped: process 0 dropped it: hung") for m in messages)
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
        news[0] = (2, [(first.address, True, "", 2, "policy-2", False),
                       (second.address, True, "", 2, "policy-2", False)], None, False)

    monkeypatch.setattr(ranks_module.dist, "broadcast_object_list", broadcast)
    try:
        assert ranks_module.Ranks(1, 2).after_push(pool, None, None) == (2, False)
        assert [(s.alive, s.version, s.adapter) for s in pool.servers] == [(True, 2, "policy-2")] * 2
    finally:
        pool.close()


def test_a_server_process_0_gave_up_restarting_is_no_longer_asked_after_on_the_other_processes(monkeypatch):
    """Process 1 watches a server process 0 restarts until process 0 gives it the weights; once process 0's
    restarts are spent, its push broadcast says so, and process 1 stops asking (it asked every second until
    the run's end) and no rollout there waits for it."""
    import time
    import warnings

    from grouprl.serve.client import ranks as ranks_module
    from grouprl.serve.client.pool import ServerPool
    from grouprl.serve.client.servers import ServerFailure

    pool = ServerPool(["127.0.0.1:9", "127.0.0.1:8002"], timeout=5)  # port 9: nothing answers
    gone, fine = pool.servers
    pool.takes_returns, pool.holds_weights = True, lambda server: False
    for server in pool.servers:
        server.restarted_elsewhere = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pool.drop(ServerFailure(gone, "POST /inference/v1/generate failed: ConnectError"))
    deadline = time.monotonic() + 10
    while not pool.watchers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gone.returning and len(pool.watchers) == 1  # asked after, every second

    def broadcast(news, src, group):  # process 0: it restarted the server, which exited; no restart left
        news[0] = (2, [(gone.address, False, "exited 1; no restart left", None, None, False),
                       (fine.address, True, "", 2, None, False)], None, False)

    monkeypatch.setattr(ranks_module.dist, "broadcast_object_list", broadcast)
    try:
        assert ranks_module.Ranks(1, 2).after_push(pool, None, None) == (2, False)
        assert not gone.returning and gone.why.endswith("; process 0 gave up on it: exited 1; no restart left")
        deadline = time.monotonic() + 10  # the watcher sees it at its next ask, within a second
        while pool.watchers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pool.watchers
    finally:
        pool.close()
