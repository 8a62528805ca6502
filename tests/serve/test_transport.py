"""How weights travel to rollout servers (grouprl.serve.weights.transport), and the pieces of the server and the
local launcher that need no server: vLLM's arguments, the cores each local server gets, a run's options."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grouprl.models import LoraSettings, apply_lora, tiny_causal_lm
from grouprl.serve.server.app import ServeOptions, engine_argv
from grouprl.serve.weights.transport import WEIGHTS_FILE, WeightFolders, reading, write_model_folder
from grouprl.trainer.config import TrainerConfig
from grouprl.trainer.local_servers import core_shares
from grouprl.trainer.rollout_servers import serve_options, server_problems


def test_a_tied_head_travels_under_its_own_name(tmp_path):
    model, _ = tiny_causal_lm(seed=0)  # tie_word_embeddings: lm_head.weight is the embedding's storage
    state = model.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    folders = WeightFolders(tmp_path)
    path = folders.write_full(model, reading(model), 1)
    back = load_file(str(path / WEIGHTS_FILE))
    assert set(back) == set(state)
    assert torch.equal(back["lm_head.weight"], state["model.embed_tokens.weight"])


def test_a_full_push_is_one_complete_folder_in_the_servers_format(tmp_path):
    model, _ = tiny_causal_lm(seed=1)
    folders = WeightFolders(tmp_path)
    path = folders.write_full(model, reading(model, dtype=torch.bfloat16), 3)
    assert path == folders.root / "v3" and sorted(p.name for p in folders.root.iterdir()) == ["v3"]
    back = load_file(str(path / WEIGHTS_FILE))
    assert set(back) == set(model.state_dict())
    for name, t in model.state_dict().items():
        assert back[name].dtype == torch.bfloat16
        assert torch.equal(back[name], t.to(torch.bfloat16)), name


def test_a_push_that_fails_midway_leaves_no_folder_a_server_could_read(tmp_path):
    model, _ = tiny_causal_lm(seed=1)
    folders = WeightFolders(tmp_path)

    read = reading(model)

    def broken():
        yield from list(read.tensors)[:3]
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        folders.write_full(model, dataclasses.replace(read, tensors=broken()), 1)
    assert list(folders.root.iterdir()) == []


def test_only_the_newest_version_is_kept_once_every_server_has_it(tmp_path):
    model, _ = tiny_causal_lm(seed=1)
    folders = WeightFolders(tmp_path)
    for v in (1, 2, 3):
        folders.write_full(model, reading(model), v)
    folders.keep_only(folders.path(3))
    assert [p.name for p in folders.root.iterdir()] == ["v3"]
    folders.remove()
    assert not folders.root.exists()


def test_a_killed_trainers_pushes_do_not_stay_in_memory(tmp_path):
    """The default root is /dev/shm: a push left there by a SIGKILLed trainer would hold a model's worth of
    memory until reboot. The folder's watcher removes it once the trainer is gone."""
    import signal
    import subprocess
    import sys
    import time

    code = ("import time\n"
            "from grouprl.models import tiny_causal_lm\n"
            "from grouprl.serve.weights.transport import WeightFolders, reading\n"
            f"folders = WeightFolders({str(tmp_path)!r})\n"
            "model = tiny_causal_lm(seed=1)[0]\n"
            "folders.write_full(model, reading(model), 1)\n"
            "print(folders.root, flush=True)\n"
            "time.sleep(600)\n")
    trainer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    root = Path(trainer.stdout.readline().strip())
    assert (root / "v1" / WEIGHTS_FILE).is_file()
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    deadline = time.monotonic() + 60  # a deadline for the watcher, not a speed claim
    while root.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not root.exists() and list(tmp_path.iterdir()) == []


def test_a_lora_policy_becomes_a_plain_model_folder_that_transformers_loads_back(tmp_path):
    from transformers import AutoModelForCausalLM

    plain, tok = tiny_causal_lm(seed=2)
    peft = apply_lora(tiny_causal_lm(seed=2)[0], LoraSettings(rank=4, target_modules=("q_proj", "v_proj")))
    write_model_folder(peft, tok, tmp_path, reading(peft))
    names = set(load_file(str(tmp_path / WEIGHTS_FILE)))
    assert names == set(plain.state_dict())  # no adapter weights, no base_layer names
    back = AutoModelForCausalLM.from_pretrained(tmp_path)
    for name, t in plain.state_dict().items():
        assert torch.equal(back.state_dict()[name], t), name


def test_vllm_arguments_on_a_cpu_follow_the_in_process_engine():
    argv = engine_argv(Path("/m"), ServeOptions(port=8123, lora_rank=4, max_rows=16),
                       256, 2**26, on_gpu=False)
    pairs = dict(zip(argv[::2], argv[1::2]))
    assert pairs["--max-lora-rank"] == "8"  # vLLM's fixed ranks: the next power of two, at least 8
    assert pairs["--kv-cache-memory-bytes"] == str(2**26) and pairs["--max-num-seqs"] == "16"
    assert pairs["--logprobs-mode"] == "processed_logprobs" and pairs["--port"] == "8123"
    assert "--no-enable-chunked-prefill" in argv and "--enforce-eager" in argv and "--enable-scale-out" in argv
    gpu = engine_argv(Path("/m"), ServeOptions(lora_rank=9), 256, 0, on_gpu=True)
    assert "--enforce-eager" not in gpu and dict(zip(gpu[::2], gpu[1::2]))["--max-lora-rank"] == "16"
    with pytest.raises(ValueError, match="fp32 or bf16"):
        ServeOptions(dtype="int8")


def test_local_servers_get_disjoint_shares_of_the_cores():
    assert core_shares(range(8), 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert core_shares([4, 5], 2) == [[4], [5]]
    assert core_shares([0], 2) == [[0], [0]]  # more servers than cores: they share


def test_a_run_tells_its_local_servers_how_to_sample():
    c = TrainerConfig(dtype="bf16", lora_rank=4, seed=7, prompts_per_step=3, group_size=4, vllm_kv_cache_gib=0.5)
    options = serve_options(c, 300)
    pairs = dict(zip(options[::2], options[1::2]))
    assert pairs == {"--rollout_dtype": "bf16", "--seed": "7", "--max_model_len": "300", "--max_rows": "12",
                     "--lora_rank": "4", "--vllm_kv_cache_gib": "0.5", "--rollout_weights_transport": "files"}
    assert dict(zip(*[iter(serve_options(TrainerConfig(dtype="fp32"), 64))] * 2))["--rollout_dtype"] == "fp32"


@pytest.mark.parametrize(("servers", "timeout", "message"), [
    (0, 60.0, "start at least 1 local server"),
    (("localhost",), 60.0, "'localhost' is not host:port"),
    (("127.0.0.1:99999",), 60.0, "is not host:port"),
    (("127.0.0.1:8000",), 0.0, "rollout_server_timeout must be > 0"),
])
def test_bad_server_settings_are_named(servers, timeout, message):
    assert any(message in p for p in server_problems(servers, timeout)), server_problems(servers, timeout)


def test_good_server_settings_have_no_problems():
    assert server_problems(None, 600.0) == []
    assert server_problems(2, 600.0) == []
    assert server_problems(("127.0.0.1:8000", "10.0.0.2:8001"), 600.0) == []


def test_a_lora_version_holds_the_base_and_the_adapter_side_by_side(tmp_path):
    peft = apply_lora(tiny_causal_lm(seed=2)[0], LoraSettings(rank=4, target_modules=("q_proj", "v_proj")))
    folders = WeightFolders(tmp_path)
    adapter = {n: t for n, t in peft.state_dict().items() if ".lora_" in n}
    folders.write_full(peft, reading(peft), 1)
    first = folders.write_adapter(peft, adapter, 1)
    assert first.name == "v1-lora" and {"adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in first.iterdir()}
    folders.write_adapter(peft, adapter, 2)
    folders.keep_only(folders.path(2, adapter=True))
    assert [p.name for p in folders.root.iterdir()] == ["v2-lora"]  # the base went to the servers once


def test_files_push_every_version_to_every_server_and_free_its_folder_once_loaded(tmp_path):
    import asyncio
    import types

    from grouprl.serve.weights.transport import FileWeights

    loads = []

    async def everywhere(work):
        await work(types.SimpleNamespace(address="s0"))

    async def request(server, method, path, body):  # the server reads the folder as it answers
        held = load_file(str(Path(body["path"]) / WEIGHTS_FILE))["lm_head.weight"]
        loads.append((path, body["version"], body["adapter"], body["resume"], torch.equal(held, head)))
        return {"version": body["version"], "adapter": None}

    pool = types.SimpleNamespace(alive=[], everywhere=everywhere, request=request, run=asyncio.run)
    model, _ = tiny_causal_lm(seed=1)
    head = model.state_dict()["lm_head.weight"]
    sender = FileWeights(pool, lora=False, weights_dir=str(tmp_path / "weights"))
    try:
        for version in (1, 2):
            sender.write(model, reading(model), version, torch.float32)
            assert [p.name for p in sender.folders.root.iterdir()] == [f"v{version}"]
            sender.push()
            assert list(sender.folders.root.iterdir()) == []  # the servers hold it: the memory back
        # the first push may step back (a resumed run); later ones only move forward
        assert loads == [("/grouprl/weights", 1, False, True, True), ("/grouprl/weights", 2, False, False, True)]
    finally:
        sender.close()
    assert not sender.folders.root.exists()


@pytest.mark.parametrize(("servers", "timeout", "message"), [
    (0, 600.0, "start at least 1 local server"),
    (("localhost",), 600.0, "localhost"),
    (None, 0.0, "rollout_server_timeout must be > 0"),
])
def test_a_bad_server_setting_is_refused_by_the_config_check_before_any_model_loads(servers, timeout, message):
    from grouprl.errors import ConfigError
    from grouprl.trainer.checks import check

    with pytest.raises(ConfigError, match=message):
        check(TrainerConfig(rollout_servers=servers, rollout_server_timeout=timeout))
