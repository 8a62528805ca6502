"""Whose deprecated call it was: tests.helpers.deprecations blames grouprl for a library deprecation only
when grouprl's code made the call, the way transformers warns (from inside itself, through torch's module
call), and the suite's filters make grouprl's own deprecations errors."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import pytest

from tests.helpers.deprecations import deprecated_calls

LIBRARY = '''
import warnings
import torch

def old_name():
    warnings.warn("old_name is deprecated", FutureWarning)

class Layer(torch.nn.Module):
    def forward(self, x, **kwargs):
        if "legacy" in kwargs:  # stacklevel 2: the warning's file is torch's module call, as with transformers
            warnings.warn("legacy is deprecated", FutureWarning, stacklevel=2)
        return x

def calls_old_name():
    old_name()
'''
CALLER = '''
import warnings
import torch
import {library} as lib

def direct():
    lib.old_name()

def through_a_module():
    return lib.Layer()(torch.zeros(1), legacy=True)

def through_the_library():
    lib.calls_old_name()

def own_warning():
    warnings.warn("a key of ours is renamed", FutureWarning)
'''


def load(tmp_path: Path, name: str, text: str):
    path = tmp_path / f"{name.replace('.', '_')}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def modules(tmp_path):
    library = load(tmp_path, "probe_library", LIBRARY)
    ours = load(tmp_path, "grouprl._probe_caller", CALLER.format(library="probe_library"))
    theirs = load(tmp_path, "probe_other", CALLER.format(library="probe_library"))
    yield library, ours, theirs
    for name in ("probe_library", "grouprl._probe_caller", "probe_other"):
        sys.modules.pop(name, None)


def blamed(call) -> tuple[list[str], list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with deprecated_calls() as found:
            call()
    return found, record


def test_a_deprecated_call_of_ours_is_found_with_its_line(modules):
    _, ours, _ = modules
    found, record = blamed(ours.direct)
    assert len(found) == 1 and found[0].endswith("FutureWarning: old_name is deprecated"), found
    assert "grouprl__probe_caller.py:7:" in found[0], found  # the line of lib.old_name() in CALLER
    assert [str(w.message) for w in record] == ["old_name is deprecated"]  # still passed on to the record


def test_through_torch_module_call_the_caller_is_still_found(modules):
    _, ours, _ = modules
    found, record = blamed(ours.through_a_module)
    assert len(found) == 1 and "grouprl__probe_caller.py:10:" in found[0], found
    assert record[0].filename.endswith("torch/nn/modules/module.py"), record[0].filename  # why filters cannot


def test_deprecations_of_other_callers_and_our_own_warnings_are_not_ours(modules):
    _, ours, theirs = modules
    for call in (theirs.direct, theirs.through_a_module, ours.through_the_library, ours.own_warning):
        found, record = blamed(call)
        assert found == [] and len(record) == 1, (call.__name__, found)


def test_grouprls_own_deprecation_warnings_are_errors_in_the_suite(modules):
    _, ours, theirs = modules
    with pytest.raises(FutureWarning, match="a key of ours is renamed"):
        ours.own_warning()
    with pytest.warns(FutureWarning):  # another module's warning stays a warning
        theirs.own_warning()
