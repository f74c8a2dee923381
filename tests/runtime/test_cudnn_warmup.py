"""cuDNN's first calls made during the compile (kiln/runtime/cudnn_warmup.py): scratch tensors shaped exactly as
the graph passes them, no random numbers drawn, nothing started off the GPU, and every compiled graph's call
waiting for the worker. On a GPU (KILN_TRITON_TEST_DEVICE=cuda), a compiled convolution network's calls are
made ahead and its results are eager's."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import pipeline
from kiln.runtime import cudnn_warmup
from kiln.runtime.cudnn_warmup import Call, ScratchTensor

aten = torch.ops.aten
on_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("spec", [
    ScratchTensor((2, 3, 8, 8), (192, 1, 24, 3), 0, torch.float32),  # channels-last
    ScratchTensor((4, 5), (1, 4), 0, torch.bfloat16),  # transposed
    ScratchTensor((3, 4), (8, 2), 5, torch.float16),  # a strided view at an offset
    ScratchTensor((0, 4), (4, 1), 0, torch.float32),  # empty
])
def test_a_scratch_tensor_has_the_graphs_layout_and_values_that_are_not_zeros(spec):
    t = spec.make(torch.device("cpu"))
    assert (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype) == (spec.size, spec.stride, spec.offset,
                                                                       spec.dtype)
    assert t.numel() == 0 or t.float().abs().sum() > 0


def test_making_a_call_draws_no_random_numbers():
    state = torch.random.get_rng_state()
    call = Call(aten.convolution.default, (ScratchTensor((1, 2, 5, 5), (50, 25, 5, 1), 0, torch.float32),
                                           ScratchTensor((3, 2, 3, 3), (18, 9, 3, 1), 0, torch.float32), None,
                                           (1, 1), (0, 0), (1, 1), False, (0, 0), 1))
    call.run(torch.device("cpu"))
    assert torch.equal(torch.random.get_rng_state(), state)


def test_nothing_starts_for_a_cpu_graph(monkeypatch):
    made = []
    monkeypatch.setattr(Call, "run", lambda self, device: made.append(self))
    call = Call(aten.convolution.default, (ScratchTensor((1, 2, 5, 5), (50, 25, 5, 1), 0, torch.float32),))
    cudnn_warmup.start([call], "cpu")
    cudnn_warmup.wait()
    assert made == [] and cudnn_warmup.pending == 0


def test_a_compiled_graph_waits_for_the_calls_its_compile_queued(monkeypatch):
    """A graph's first call must not run beside cuDNN timing its algorithms."""
    waited = []
    monkeypatch.setattr(cudnn_warmup, "pending", 2)
    monkeypatch.setattr(cudnn_warmup, "wait", lambda: waited.append(True))
    compiled = pipeline.CompiledGraph(lambda args: [a * 2 for a in args], {})
    assert compiled(torch.ones(2))[0].tolist() == [2.0, 2.0]
    assert waited == [True]


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.depthwise = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.head = torch.nn.Conv2d(16, 8, 1)

    def forward(self, x):
        return self.head(F.relu(self.depthwise(F.relu(self.stem(x))))).mean((2, 3))


@on_gpu
def test_a_compiled_network_makes_its_convolutions_ahead_and_computes_eagers_results():
    torch.manual_seed(0)
    model = ConvNet().cuda()
    x = torch.randn(4, 3, 16, 16, device="cuda", requires_grad=True)
    before = dict(cudnn_warmup.stats)
    compiled = kiln.compile(model)
    out = compiled(x)
    out.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    want = model(x)
    want.sum().backward()
    assert cudnn_warmup.stats["made"] > before["made"] and cudnn_warmup.stats["failed"] == before["failed"]
    assert cudnn_warmup.pending == 0
    torch.testing.assert_close(out, want, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(grad, x.grad, rtol=1e-3, atol=1e-3)
