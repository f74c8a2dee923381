"""A compiled CUDA graph runs, and its kernels are built, with the graph's device current
(kiln/runtime/current_device.py, kiln/codegen/triton/__init__.py's `precompile_all`).

Triton loads a binary into the current device's context. A DDP rank on `cuda:1` compiled its kernels in
build threads (current device 0) and every launch failed with "invalid resource handle"; a model moved to
`cuda:1` in a process that never sets the device fails the same way at launch. The switch itself is checked
anywhere; the compiled graphs on a second GPU run where there are two (the tests marked `two_gpus`)."""
from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import kiln
from kiln.runtime import current_device
from kiln.runtime.current_device import with_current_device

two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


def test_a_cpu_graph_runs_as_it_is():
    def call(x):
        return x

    assert with_current_device(call, "cpu") is call


def test_the_device_is_switched_only_when_another_is_current(monkeypatch):
    current, entered = [0], []

    class Switch:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            entered.append(self.index)
            current.insert(0, self.index)

        def __exit__(self, *exc):
            current.pop(0)

    monkeypatch.setattr(current_device.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(current_device.torch._C, "_cuda_getDevice", lambda: current[0], raising=False)
    monkeypatch.setattr(current_device.torch.cuda, "device", Switch)
    seen = []
    run = with_current_device(lambda x: seen.append(current[0]) or x, "cuda:1")
    assert run(5) == 5 and seen == [1] and entered == [1] and current == [0]
    current[0] = 1
    run(6)
    assert seen == [1, 1] and entered == [1]  # already current: no switch


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(64), nn.Linear(64, 64)

    def forward(self, x):
        return torch.relu(self.fc(self.norm(x))) * 2 + x


@two_gpus
def test_a_model_on_the_second_gpu_compiles_and_runs_with_the_first_current():
    torch.cuda.set_device(0)
    model = Block().to("cuda:1")
    x = torch.randn(32, 64, device="cuda:1")
    compiled = kiln.compile(model)
    torch.testing.assert_close(compiled(x), model(x))
    torch.testing.assert_close(compiled(x * 3), model(x * 3))


@two_gpus
def test_a_rank_thread_on_the_second_gpu_builds_its_kernels_there():
    """A DDP rank's pattern: the thread sets its device, compiles (kernels built in other threads), runs."""
    results = {}

    def rank():
        torch.cuda.set_device(1)
        model = Block().cuda()
        x = torch.randn(32, 64, device="cuda")
        results["got"], results["expected"] = kiln.compile(model)(x), model(x)

    worker = threading.Thread(target=rank)
    worker.start()
    worker.join()
    torch.testing.assert_close(results["got"], results["expected"])
