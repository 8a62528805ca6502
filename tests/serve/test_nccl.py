"""The weight transports (grouprl.serve.weights.transport, collective, gloo) without a GPU: the choice and its messages,
what a server enables, the tensors a push sends (names, tied head, LoRA merged, format), the packing both sides
of the gloo wire agree on, and a server that cannot join named with the timeout. The real pushes are in
test_gloo.py (CPU servers) and at the end here (NCCL, two GPUs)."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grouprl.config import check
from grouprl.errors import ConfigError
from grouprl.models import LoraSettings, apply_lora, tiny_causal_lm
from grouprl.rollout.vllm_weights import base_weight_name
from grouprl.serve.client.collective import CollectiveWeights, rank_offsets
from grouprl.serve.server.app import ServeOptions, engine_argv
from grouprl.serve.server.parent import kill_group
from grouprl.serve.weights.sent import LiveWeights, StagedWeights, merged_lora_tensors, staged_copy, tensors_to_send
from grouprl.serve.weights.transport import TRANSPORTS, reading, resolve_transport, server_transport
from tests.helpers.servers import FakeServer, JsonHandler, tiny_server_info

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)
HAS_VLLM = importlib.util.find_spec("vllm") is not None


# -- the choice ---------------------------------------------------------------------------------------
def test_auto_sends_files_from_a_cpu_policy_and_says_why():
    name, why = resolve_transport("auto", CPU)
    assert name == "files" and why == "auto: the policy is on cpu, not a CUDA device"


@pytest.mark.skipif(not HAS_VLLM, reason="auto takes nccl only where vLLM's NCCL engine is installed")
def test_auto_takes_nccl_from_a_cuda_policy_unless_the_servers_share_its_gpu():
    assert resolve_transport("auto", CUDA)[0] == "nccl"
    name, why = resolve_transport("auto", CUDA, local_servers=True)
    assert name == "files" and "share the trainer's GPU" in why
    with pytest.raises(ConfigError, match="rollout_weights_transport=nccl: the servers started here share"):
        resolve_transport("nccl", CUDA, local_servers=True)


def test_an_explicit_transport_that_cannot_run_is_named_with_the_reason():
    with pytest.raises(ConfigError) as e:
        resolve_transport("nccl", CPU)
    assert str(e.value).startswith("rollout_weights_transport=nccl: the policy is on cpu, not a CUDA device")
    with pytest.raises(ConfigError, match=r"rollout_weights_transport='ncl': choose auto, files, gloo, nccl"):
        resolve_transport("ncl", CPU)
    assert resolve_transport("files", CUDA) == ("files", "rollout_weights_transport=files")


def test_a_bad_transport_in_the_config_is_named_before_anything_loads():
    from grouprl.trainer.config import TrainerConfig

    with pytest.raises(ValueError, match="rollout_weights_transport='udp': choose auto, files, gloo, nccl"):
        check(TrainerConfig(rollout_weights_transport="udp"))


def test_the_plan_records_the_transport_only_for_servers(tmp_path):
    from grouprl.models.precision import pinned, resolve_formats
    from grouprl.trainer.rollout_plan import plan_rollout
    from grouprl.trainer.trainer import with_values
    from tests.helpers.trainer import base_config

    model, _ = tiny_causal_lm()
    for servers, transport, line in ((2, "auto", "files (auto: the policy is on cpu, not a CUDA device)"),
                                     (("10.0.0.2:8000",), "files", "files (rollout_weights_transport=files)")):
        config = base_config(tmp_path, rollout_servers=servers, rollout_weights_transport=transport)
        formats = resolve_formats(config.dtype, config.ref_dtype, config.rollout_dtype)
        plan = plan_rollout(with_values(config, pinned(formats)), formats, model, CPU, multi_turn=False)
        assert plan.setup()["rollout_weights_transport"] == line
    config = base_config(tmp_path, rollout_engine="hf")
    formats = resolve_formats(config.dtype, config.ref_dtype, config.rollout_dtype)
    assert "rollout_weights_transport" not in plan_rollout(config, formats, model, CPU, multi_turn=False).setup()


# -- the server's side --------------------------------------------------------------------------------
def test_a_server_enables_what_its_machine_runs_and_tells_vllm():
    assert server_transport("auto", cuda=False).backend == "gloo"
    assert server_transport("auto", cuda=True).backend == "nccl"
    assert server_transport("files", cuda=True).backend is None
    with pytest.raises(ValueError, match="rollout_weights_transport=nccl: this server has no CUDA device"):
        server_transport("nccl", cuda=False)
    with pytest.raises(ValueError, match="rollout_weights_transport='shm'"):
        ServeOptions(weight_transfer="shm")

    def argv(transport, gpu):  # flag -> the argument after it
        out = engine_argv(Path("/m"), ServeOptions(weight_transfer=transport), 256, 2**20, gpu)
        return {flag: out[i + 1] if i + 1 < len(out) else None for i, flag in enumerate(out) if flag.startswith("--")}

    cpu = argv("auto", False)
    assert json.loads(cpu["--weight-transfer-config"]) == {"backend": "gloo"}
    assert cpu["--worker-extension-cls"] == "grouprl.serve.weights.gloo.GlooWorkerExtension"  # registers it there
    gpu = argv("auto", True)
    assert json.loads(gpu["--weight-transfer-config"]) == {"backend": "nccl"} and "--worker-extension-cls" not in gpu
    assert "--weight-transfer-config" not in argv("files", True)


# -- what a push sends --------------------------------------------------------------------------------
def test_a_push_sends_every_weight_under_its_plain_name_in_the_servers_format():
    model, _ = tiny_causal_lm(seed=1)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    sent = staged_copy(model, torch.bfloat16)
    names = [n for n, _ in sent]
    assert names == list(model.state_dict())  # both names of the tied head
    tensors = dict(sent)
    assert all(t.dtype == torch.bfloat16 and t.is_contiguous() for t in tensors.values())
    assert tensors["lm_head.weight"].data_ptr() != tensors["model.embed_tokens.weight"].data_ptr()  # own copies
    assert torch.equal(tensors["lm_head.weight"], model.lm_head.weight.detach().to(torch.bfloat16))
    staged = dict(staged_copy(model, torch.float32))  # in the model's own format: copied all the same
    with torch.no_grad():  # a copy: the trainer may update while it waits to be sent
        model.model.norm.weight.add_(1.0)
    assert torch.equal(tensors["model.norm.weight"], torch.ones_like(tensors["model.norm.weight"]))
    assert torch.equal(staged["model.norm.weight"], torch.ones_like(staged["model.norm.weight"]))


@pytest.mark.parametrize("lora", [False, True])
def test_a_synchronous_push_reads_the_model_as_it_sends_and_sends_what_a_staged_copy_would(lora):
    """No copy of the model in a synchronous run: the same names, formats, shapes and values as a staged copy,
    the model's own tensors where nothing changes them, and the same again when a failed push is made again."""
    model, _ = tiny_causal_lm(seed=3)
    if lora:
        model = apply_lora(model, LoraSettings(rank=4, alpha=8))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".lora_B" in name:
                    p.fill_(0.01)  # B starts at zero: a merge that did nothing would pass
    for dtype in (torch.float32, torch.bfloat16):
        staged, live = StagedWeights(staged_copy(model, dtype)), LiveWeights(model, dtype)
        assert live.metadata() == staged.metadata()
        want = dict(staged)
        for _ in range(2):  # a push made again reads the model again
            got = list(live)
            assert [n for n, _ in got] == list(want)
            for name, t in got:
                assert torch.equal(t, want[name]), name
        if dtype == torch.float32:
            own = {t.data_ptr() for t in model.state_dict().values()}
            made = [n for n, t in live if t.data_ptr() not in own]
            # every tensor sent as the model holds it, but a merged LoRA projection (W + scale B A, made anew)
            adapted = [base_weight_name(k) for k in model.state_dict() if k.endswith(".base_layer.weight")]
            assert made == adapted and (len(made) > 0) == lora
            assert all(t.data_ptr() != want[n].data_ptr() for n, t in live)  # the staged copy is a copy


def test_a_staged_copy_copies_the_models_own_tensors_and_keeps_gathered_ones_as_they_are():
    """Under FSDP the state a push stages is gathered, new tensors already: a second copy of each would double
    the staged push's memory at the write."""
    model, _ = tiny_causal_lm(seed=1)
    gathered = {k: v.clone() for k, v in model.state_dict().items()}  # as full_tensor() makes them
    staged = dict(staged_copy(model, torch.float32, gathered))
    assert all(staged[k].data_ptr() == gathered[k].data_ptr() for k in gathered)
    own = dict(staged_copy(model, torch.float32))
    assert all(own[k].data_ptr() != v.data_ptr() for k, v in model.state_dict().items())


def test_a_collective_sender_stages_a_copy_only_where_the_trainer_may_update_first():
    model, _ = tiny_causal_lm(seed=1)
    sender = CollectiveWeights.__new__(CollectiveWeights)
    for stages in (False, True):
        sender.stages = lambda stages=stages: stages
        read = reading(model)
        with read.through():
            sender.write(model, read, 3, torch.float32)
        assert isinstance(sender.sending, StagedWeights if stages else LiveWeights) and sender.version == 3
    before = dict(sender.sending)["model.norm.weight"].clone()
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)  # an update while the staged push waits
    assert torch.equal(dict(sender.sending)["model.norm.weight"], before)


def test_a_lora_policy_goes_merged_as_peft_merges_it():
    base, _ = tiny_causal_lm(seed=2)
    model = apply_lora(base, LoraSettings(rank=4, alpha=8))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    merged = dict(merged_lora_tensors(model))
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    assert list(merged) == list(want)
    gap = max(float((merged[n] - want[n]).abs().max()) for n in want)
    assert gap < 1e-6, gap  # the same W + (alpha / r) B A; only the order of the additions may differ
    # by hand for one projection: scale = alpha / rank = 2
    q = model.base_model.model.model.layers[0].self_attn.q_proj
    by_hand = q.base_layer.weight + 2.0 * q.lora_B["default"].weight @ q.lora_A["default"].weight
    assert torch.allclose(merged["model.layers.0.self_attn.q_proj.weight"], by_hand, atol=1e-6)
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], q.base_layer.weight)  # it moved
    assert [n for n, _ in tensors_to_send(model, torch.float32)] == list(want)


def test_each_server_gets_its_own_ranks_after_the_trainers():
    assert rank_offsets([1, 1]) == [1, 2]
    assert rank_offsets([2, 4, 1]) == [1, 3, 7]  # 1 + 2 = 3, 3 + 4 = 7: world size 1 + 7 = 8
    with pytest.raises(ValueError, match="reported 0 workers"):
        rank_offsets([1, 0])


@pytest.mark.skipif(not HAS_VLLM, reason="the gloo backend is vLLM's weight-transfer engine")
def test_both_sides_of_the_gloo_wire_cut_and_read_chunks_alike():
    from grouprl.serve.weights.gloo import as_bytes, chunk_bounds, from_bytes

    # sizes 8, 6, 12, 2 bytes under a limit of 10: 8 -> 14 passes it (chunk 0-1), 12 passes alone, 2 is left
    assert chunk_bounds([8, 6, 12, 2], 10) == [(0, 2), (2, 3), (3, 4)]
    assert chunk_bounds([], 10) == []
    with pytest.raises(ValueError, match="at least 1 byte"):
        chunk_bounds([1], 0)
    tensors = [torch.arange(2, dtype=torch.float32), torch.tensor([[1.5, -2.0, 3.25]], dtype=torch.bfloat16),
               torch.tensor([7, -9], dtype=torch.int64).t()]
    buffer = torch.cat([as_bytes(t) for t in tensors])
    assert buffer.numel() == 8 + 6 + 16
    back = from_bytes(buffer, [t.dtype for t in tensors], [t.shape for t in tensors])
    assert all(torch.equal(a, b) for a, b in zip(back, tensors))
    with pytest.raises(ValueError, match="cannot hold"):
        from_bytes(buffer[:-1], [t.dtype for t in tensors], [t.shape for t in tensors])


# -- a server that cannot join ------------------------------------------------------------------------
class JoinlessServer(FakeServer):
    """An HTTP server that answers /grouprl/info as a server of the tiny model would, with ``transfer`` enabled,
    and takes ``join_s`` seconds to answer a join (it never joins the group)."""

    def __init__(self, transfer, join_s=30.0):
        info = tiny_server_info(transfer)

        class Handler(JsonHandler):
            def do_GET(self):
                self.reply(info)

            def do_POST(self):
                time.sleep(join_s)
                with contextlib.suppress(OSError):  # the trainer may have given up and closed the connection
                    self.reply({})

        super().__init__(Handler)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="the group is formed by vLLM's trainer engine")
def test_a_server_that_does_not_join_in_time_is_named_with_the_timeout():
    from grouprl.serve.client.server_sampler import ServerSampler
    from grouprl.serve.client.servers import RolloutServerError

    model, tok = tiny_causal_lm()
    server = JoinlessServer("gloo")
    start = time.monotonic()
    try:
        with pytest.raises(RolloutServerError) as e:
            ServerSampler(model, tok, [server.address], timeout=3, transport="gloo")
    finally:
        server.close()
    said = str(e.value)
    assert f"{server.address} did not join within 3 s (rollout_server_timeout)" in said, said
    assert said.startswith("the gloo weight-transfer group (trainer at 127.0.0.1:")
    assert time.monotonic() - start < 25  # the timeout, not the server's 30 s


def test_a_server_without_the_transport_is_named_before_any_push():
    from grouprl.serve.client.server_sampler import ServerSampler
    from grouprl.serve.client.servers import RolloutServerError

    model, tok = tiny_causal_lm()
    server = JoinlessServer(None, join_s=0)
    try:
        with pytest.raises(RolloutServerError) as e:
            ServerSampler(model, tok, [server.address], timeout=5, transport="nccl")
    finally:
        server.close()
    assert str(e.value) == (f"rollout server {server.address} takes weights over files only, not nccl: start it "
                            "with --rollout_weights_transport nccl")
    assert "nccl" in TRANSPORTS and TRANSPORTS.get("nccl").backend == "nccl"


# -- NCCL for real: a server on a second GPU ----------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2 or not HAS_VLLM,
                    reason="NCCL needs the trainer and the server on two CUDA devices (one rank per GPU) and "
                           "vLLM's GPU build")
def test_an_nccl_push_makes_the_server_sample_the_trainers_greedy_completions(tmp_path):
    from grouprl.rollout.sampler import Sampler
    from grouprl.serve.client.server_sampler import ServerSampler
    from grouprl.serve.client.servers import free_port
    from grouprl.types import SamplingParams
    from tests.helpers.servers import TINY64, write_tiny64

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 products on both sides
    folder = write_tiny64(tmp_path / "model", seed=0)
    port = free_port()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "1"}
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 - the server holds it until it ends
    server = subprocess.Popen([sys.executable, "-m", "grouprl", "serve", "--model", str(folder), "--port", str(port),
                               "--rollout_dtype", "fp32", "--max_model_len", "256", "--max_rows", "16",
                               "--vllm_gpu_memory_utilization", "0.3", "--rollout_weights_transport", "nccl"],
                              stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    model, tok = tiny_causal_lm(seed=3, **TINY64)
    model = model.to(CUDA)
    try:
        client = ServerSampler(model, tok, [f"127.0.0.1:{port}"], timeout=600, transport="nccl")
        try:
            ids = Sampler(model, tok).encode([f"Count: {i}" for i in range(4)])
            greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            client.update_weights(model)
            want = Sampler(model, tok).generate(ids, 1, greedy, seed=0)
            got = client.generate(ids, 1, greedy, seed=0)
            assert got.completion_ids.tolist() == want.completion_ids.cpu().tolist()
            assert got.info["policy_version"] == [1] * 4
            assert client.metrics()["time/weight_sync"] > 0
        finally:
            client.close()
    finally:
        kill_group(server.pid)  # its resource tracker left to free vLLM's shared memory
        server.wait()
        log.close()
