"""A frame kiln runs eagerly still compiles the modules it calls (kiln/capture/eager_frames.py).

A break inside a try block cannot be resumed, so kiln runs that frame eagerly, as torch.compile skips it; but
torch.compile's frame hook goes on compiling what the skipped frame calls. transformers wraps each model's forward
in a try/finally, so a data-dependent branch in a model (OPT's layer drop) left every layer eager under kiln. The
cases compare values with eager and graph counts with torch.compile, and check that module calls outside the
eager frame's context stay torch's own.
"""
import threading

import pytest
import torch

import kiln
from support.capture import assert_same

pytestmark = pytest.mark.allows_fallback("graph_break: each case breaks on a tensor's value inside a try block")

TORCH_CALL = torch.nn.Module.__call__


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.linear(x)) + 1


class LayerDrop(torch.nn.Module):
    """OPT's decoder: a random draw decides, per layer, whether it runs; the draw's branch breaks the graph."""

    def __init__(self, n=3, drop=0.0):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer() for _ in range(n))
        self.drop = drop

    def forward(self, x):
        x = x * 2
        for layer in self.layers:
            if torch.rand([]) < self.drop:
                continue
            x = layer(x)
        return x


def collecting(forward):
    """transformers' `capture_outputs`: the forward runs inside a try/finally."""
    def wrapper(self, *args, **kwargs):
        state = []
        try:
            return forward(self, *args, **kwargs)
        finally:
            state.clear()
    return wrapper


class Model(torch.nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body
        self.head = torch.nn.Linear(8, 2)

    @collecting
    def forward(self, x):
        return self.head(self.body(x)).sum()


class RecordingBackend:
    """Keeps the code of each graph handed to it and runs it as captured."""

    def __init__(self):
        self.codes: list[str] = []

    def __call__(self, gm, example_inputs):
        self.codes.append(gm.code)
        return gm.forward


def _graphs(make_model, x, calls=2):
    torch.manual_seed(0)
    model = make_model()
    torch._dynamo.reset()
    reference = RecordingBackend()
    expected = torch.compile(model, backend=reference)(x)
    backend = RecordingBackend()
    compiled = kiln.compile(model, backend=backend)
    for _ in range(calls):
        assert_same(compiled(x), expected)
    return backend.codes, reference.codes


def test_layers_called_from_a_frame_run_eagerly_are_compiled():
    graphs, torch_graphs = _graphs(lambda: Model(LayerDrop()), torch.randn(4, 8))
    assert any("relu" in code for code in torch_graphs)
    assert any("relu" in code for code in graphs)  # the layers: before, the whole model ran eagerly
    assert torch.nn.Module.__call__ is TORCH_CALL


def test_training_through_the_compiled_layers_matches_eager():
    torch.manual_seed(0)
    model, reference = Model(LayerDrop()), Model(LayerDrop())
    reference.load_state_dict(model.state_dict())
    compiled = kiln.compile(model)
    x = torch.randn(4, 8)
    for _ in range(2):
        compiled(x).backward()
        reference(x).backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert_same(p.grad, q.grad, path=name)


def test_more_layer_instances_than_the_recompile_limit_all_compile():
    """Twelve layers of one class: one entry serves them all (a module is guarded by its class), so the recompile
    limit is never near; tests/capture/test_module_instances.py has layers that need an entry each."""
    x = torch.randn(4, 8)
    graphs, _ = _graphs(lambda: Model(LayerDrop(n=12)), x)
    assert sum("relu" in code for code in graphs) >= 1
    assert kiln.fallbacks.counts().get("frame_limit", 0) == 0  # strict: a frame_limit fallback would have raised


def test_layers_held_in_an_nn_sequential_are_compiled():
    """timm's blocks sit in an nn.Sequential, whose forward is torch's code: the eager frame's call of it runs as
    torch's, and the layers it calls are compiled."""
    class Blocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.Sequential(Layer(), Layer())

        @collecting
        def forward(self, x):
            if x.sum() > 1e9:
                x = x * 0
            return self.blocks(x).sum()

    graphs, torch_graphs = _graphs(Blocks, torch.randn(4, 8))
    assert any("relu" in code for code in torch_graphs)
    assert any("relu" in code for code in graphs)


def test_torch_modules_called_from_the_eager_frame_stay_eager():
    """nn.Linear's forward is torch's code, which torch.compile's frame hook skips too."""
    class Direct(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        @collecting
        def forward(self, x):
            y = self.linear(x)
            if y.sum() > 1e9:
                return y * 0
            return y

    graphs, _ = _graphs(Direct, torch.randn(4, 8))
    assert not any("linear" in code for code in graphs)


def test_an_exception_in_a_compiled_layer_leaves_module_calls_as_torchs():
    class Raising(torch.nn.Module):
        def forward(self, x):
            if x.shape[0] == 3:
                raise ValueError("three rows")
            return x + 1

    class Body(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Raising()

        @collecting
        def forward(self, x):
            if x.sum() > 1e9:
                x = x * 0
            return self.inner(x)

    compiled = kiln.compile(Body())
    assert_same(compiled(torch.ones(2, 4)), torch.ones(2, 4) + 1)
    with pytest.raises(ValueError, match="three rows"):
        compiled(torch.ones(3, 4))
    assert torch.nn.Module.__call__ is TORCH_CALL


def test_module_calls_of_another_thread_during_the_eager_frame_are_not_compiled():
    """The eager frame's compile context is its own thread's: another thread's module calls run as torch's."""
    started, release = threading.Event(), threading.Event()
    seen_in_thread = []

    class Waiting(torch.nn.Module):
        def forward(self, x):
            started.set()
            release.wait(10)
            return x * 3

    class Body(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Waiting()

        @collecting
        def forward(self, x):
            if x.sum() > 1e9:
                x = x * 0
            return self.inner(x)

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen_in_thread.append(torch.compiler.is_compiling())
            return x - 1

    compiled = kiln.compile(Body(), backend="eager")
    result = []
    worker = threading.Thread(target=lambda: result.append(compiled(torch.ones(2))))
    worker.start()
    assert started.wait(10)
    probe_out = Probe()(torch.ones(2))  # main thread, while the eager frame runs in the worker
    release.set()
    worker.join(10)
    assert_same(probe_out, torch.zeros(2))
    assert seen_in_thread == [False]
    assert_same(result[0], torch.full((2,), 3.0))
    assert torch.nn.Module.__call__ is TORCH_CALL
