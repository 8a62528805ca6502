"""The allocator setting: which library ``auto`` picks, what is refused, the environment a command
restarts with, reading which one runs, and a real restart under a preloaded library (a stand-in
built here with the C compiler, so the test does not depend on what the machine has installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grouprl.config import TrainConfig, from_dict
from grouprl.errors import ConfigError
from grouprl.run.allocator import (
    PRELOADED,
    Allocator,
    describe,
    preload_environ,
    resolve,
    running,
)

ROOT = Path(__file__).resolve().parents[2]


def libs(tmp_path: Path, *files: str) -> list[Path]:
    """Two library folders; ``files`` are created in the second (so a search must go past the first)."""
    first, second = tmp_path / "lib1", tmp_path / "lib2"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    for f in files:
        (second / f).write_bytes(b"")
    return [first, second]


def maps_file(tmp_path: Path, *paths: str) -> Path:
    lines = ["7f0000000000-7f0000001000 r--p 00000000 00:00 0 "]  # an anonymous mapping: no path
    lines += [f"7f00000{i:05x}000-7f00000{i:05x}fff r-xp 00000000 fe:01 {1000 + i}                    {p}"
              for i, p in enumerate(paths)]
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "maps"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_auto_takes_tcmalloc_before_jemalloc_and_nothing_when_neither_is_installed(tmp_path):
    both = libs(tmp_path, "libjemalloc.so.2", "libtcmalloc_minimal.so.4")
    assert resolve("auto", both) == Allocator("tcmalloc", both[1] / "libtcmalloc_minimal.so.4")
    only_je = libs(tmp_path / "je", "libjemalloc.so.2")
    assert resolve("auto", only_je) == Allocator("jemalloc", only_je[1] / "libjemalloc.so.2")
    full_tc = libs(tmp_path / "tc", "libtcmalloc.so.4")  # gperftools' full library provides it too
    assert resolve("tcmalloc", full_tc).path.name == "libtcmalloc.so.4"
    assert resolve("auto", libs(tmp_path / "none")) is None
    assert resolve("system", both) is None


def test_what_is_not_there_is_refused_naming_the_setting_and_how_to_install_it(tmp_path):
    with pytest.raises(ConfigError, match=r"allocator: tcmalloc is not installed.*apt-get install libtcmalloc"):
        resolve("tcmalloc", libs(tmp_path, "libjemalloc.so.2"))
    with pytest.raises(ConfigError, match=r"allocator: '/nowhere/libtcmalloc.so.4' is not a file"):
        resolve("/nowhere/libtcmalloc.so.4")
    with pytest.raises(ConfigError, match=r"allocator: unknown allocator 'tcmaloc' \(did you mean 'tcmalloc'.*"
                                          r"valid names: jemalloc, tcmalloc, or auto, system or a library's path"):
        resolve("tcmaloc")
    with pytest.raises(ValueError, match="allocator"):  # the config refuses it before anything is loaded
        from_dict(TrainConfig, {"allocator": "/nowhere/libjemalloc.so.2", "model": "tiny"})
    lib = tmp_path / "libtcmalloc_minimal.so.4.5.10"
    lib.write_bytes(b"")
    assert resolve(str(lib)) == Allocator("tcmalloc", lib)  # a path is taken as given, named by its file


def test_the_restart_environment_puts_the_allocator_first_and_marks_itself(tmp_path):
    dirs = libs(tmp_path, "libjemalloc.so.2")
    plain = maps_file(tmp_path, "/usr/lib/libc.so.6")
    env = preload_environ("auto", {"LD_PRELOAD": "/opt/mine.so", "HOME": "/root"}, dirs, plain)
    assert env == {"LD_PRELOAD": f"{dirs[1] / 'libjemalloc.so.2'} /opt/mine.so", "HOME": "/root",
                   PRELOADED: "jemalloc"}
    assert preload_environ("auto", {PRELOADED: "jemalloc"}, dirs, plain) is None  # never a third start
    assert preload_environ("system", {}, dirs, plain) is None
    assert preload_environ("auto", {}, libs(tmp_path / "none"), plain) is None
    loaded = maps_file(tmp_path / "none", "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10")
    assert preload_environ("auto", {}, dirs, loaded) is None  # the user's own LD_PRELOAD already did it


def test_the_memory_map_says_which_allocator_runs(tmp_path):
    path = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10"
    assert running(maps_file(tmp_path, "/usr/lib/libc.so.6", path)) == Allocator("tcmalloc", Path(path))
    assert running(maps_file(tmp_path / "x", "/usr/lib/libc.so.6", "/usr/lib/libtcmalloc_minimal_debug.so.4")) is None
    assert running(tmp_path / "no-such-file") is None
    none_dirs = libs(tmp_path / "d", "libjemalloc.so.2")
    text = describe(none_dirs, maps_file(tmp_path / "d", "/usr/lib/libc.so.6"))
    assert "C library's malloc" in text and f"LD_PRELOAD={none_dirs[1] / 'libjemalloc.so.2'}" in text
    assert describe(none_dirs, maps_file(tmp_path, path)) == f"tcmalloc ({path})"


@pytest.fixture(scope="module")
def stand_in_jemalloc(tmp_path_factory) -> Path:
    """A shared library named as jemalloc's (it replaces nothing): what LD_PRELOAD loads is visible."""
    folder = tmp_path_factory.mktemp("lib")
    source = folder / "empty.c"
    source.write_text("int grouprl_stand_in(void) { return 1; }\n")
    lib = folder / "libjemalloc.so.2"
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "a C compiler builds the stand-in library"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    return lib


def test_a_restarted_process_runs_under_the_preloaded_library(stand_in_jemalloc):
    child = ("import os; from grouprl.run.allocator import running, PRELOADED; "
             "print(running(), os.environ[PRELOADED], os.getpid())")
    parent = ("import os, sys; from grouprl.run.allocator import restart_with_allocator; "
              "print(os.getpid(), flush=True); "
              f"restart_with_allocator({str(stand_in_jemalloc)!r}, [sys.executable, '-c', {child!r}]); "
              "print('not restarted')")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", PRELOADED)}
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, check=True, env=env,
                         cwd=ROOT).stdout.split()
    pid = out[0]
    assert "not restarted" not in " ".join(out)
    assert out[1:] == ["Allocator(name='jemalloc',", f"path=PosixPath('{stand_in_jemalloc}'))", "jemalloc", pid]
    # the same process (execve keeps the pid): torchrun and a shell still wait on what they started


@pytest.mark.slow  # a whole grouprl train in a process of its own
def test_grouprl_train_restarts_under_its_allocator_and_says_so(stand_in_jemalloc, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", PRELOADED)}
    common = ["--model", "tiny", "--total_steps", "1", "--prompts_per_step", "1", "--group_size", "2",
              "--max_new_tokens", "2", "--eval_size", "0", "--train_size", "4", "--no-progress"]
    proc = subprocess.run([sys.executable, "-m", "grouprl", "train", *common, "--allocator", str(stand_in_jemalloc),
                           "--output_dir", str(tmp_path / "run")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"allocator: jemalloc ({stand_in_jemalloc})" in proc.stdout.splitlines()
    proc = subprocess.run([sys.executable, "-m", "grouprl", "train", *common, "--allocator", "system",
                           "--output_dir", str(tmp_path / "system")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert any(line.startswith("allocator: the C library's malloc") for line in proc.stdout.splitlines())
