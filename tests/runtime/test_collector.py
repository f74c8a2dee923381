"""kiln/runtime/collector.py: Python's cycle collector is paused while kiln captures and loads from the compile
cache, on again where a compile starts work that may run long (an AOT trace, the code generator's stages, a
user's backend), on after the capture in every case, and never turned on where the user turned it off."""
from __future__ import annotations

import gc

import pytest
import torch

import kiln
from kiln import pipeline
from kiln.runtime import graph_cache


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def _net():
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())


def _recording(monkeypatch, module, name: str) -> list[bool]:
    """Whether the collector was on at each call of `module.name`."""
    seen, fn = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: seen.append(gc.isenabled()) or fn(*a, **k))
    return seen


def test_a_warm_compile_runs_paused_and_a_cold_one_resumes_to_compile(collector_on, fresh_cache, monkeypatch):
    compiled = _recording(monkeypatch, pipeline, "_compile_stages")
    net, x = _net(), torch.randn(2, 4)
    torch.testing.assert_close(kiln.compile(net)(x), net(x))
    assert compiled and all(compiled)  # nothing in the cache: the code generator runs with the collector on
    cold = len(compiled)
    kiln.reset()  # as a new process: everything from the cache
    looked_up = _recording(monkeypatch, graph_cache, "lookup")
    torch.testing.assert_close(kiln.compile(net)(x), net(x))
    assert looked_up and not any(looked_up)  # the AOT entry and the forward and backward products
    assert len(compiled) == cold and gc.isenabled()  # nothing compiled


def test_a_users_backend_runs_with_the_collector_on(collector_on):
    seen = []

    def backend(gm, example_inputs):
        seen.append(gc.isenabled())
        return gm.forward

    x = torch.ones(3)
    torch.testing.assert_close(kiln.compile(lambda t: t.sin() + 1, backend=backend)(x), x.sin() + 1)
    assert seen == [True] and gc.isenabled()


def test_a_capture_that_raises_turns_the_collector_on_again(collector_on):
    def backend(gm, example_inputs):
        raise ValueError("a backend that fails")

    with pytest.raises(Exception, match="a backend that fails"):
        kiln.compile(lambda x: x * 2, backend=backend, fullgraph=True)(torch.ones(3))
    assert gc.isenabled()


def test_a_collector_the_user_turned_off_stays_off(fresh_cache):
    was = gc.isenabled()
    gc.disable()
    try:
        net, x = _net(), torch.randn(2, 4)
        torch.testing.assert_close(kiln.compile(net)(x), net(x))
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()
