"""One entry for many instances of a module class (kiln/capture/builder.py `_module`).

A module is guarded by its class and by what capture read of it (training flag, hooks, attribute values that
became constants, its parameters' and buffers' shapes, dtypes and requires_grad, its submodules' classes), and its
parameters and buffers are graph inputs: the twelve layers of a decoder share one graph, as under torch.compile
(whose graph count each case measures with a counting backend). An instance that differs in anything the code
read recompiles, and each instance computes with its own parameters: every case compares with eager per instance.
"""
import copy

import pytest
import torch
from torch import nn

import kiln
from kiln.api import context_of
from support.capture import CountingBackend, assert_same, graph_count


class Layer(nn.Module):
    def __init__(self, scale=2, act="relu", width=4, bias=True, residual=False):
        super().__init__()
        self.fc = nn.Linear(width, width, bias=bias)
        self.scale, self.act, self.residual = scale, act, residual

    def forward(self, x):
        y = self.fc(x)
        y = torch.relu(y) if self.act == "relu" else torch.tanh(y)
        if self.residual:
            y = y + x
        return y * self.scale


def call(layer, x):
    return layer(x)


def graphs_for(fn, calls, reference_calls=None):
    """Run `fn` on each argument tuple of `calls` eagerly, under kiln and under torch.compile (each with a
    counting backend); kiln's result must equal eager's on each call. Returns (kiln's graphs, torch's)."""
    torch._dynamo.reset()
    kiln_backend, torch_backend = CountingBackend(), CountingBackend()
    compiled, reference = kiln.compile(fn, backend=kiln_backend), torch.compile(fn, backend=torch_backend)
    for args in calls:
        assert_same(compiled(*args), fn(*args))
    for args in reference_calls or calls:
        reference(*args)
    return kiln_backend.graphs, torch_backend.graphs


def test_instances_of_one_layer_class_share_one_graph():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    graphs, torch_graphs = graphs_for(call, [(Layer(), x) for _ in range(6)])
    assert graphs == 1 and graphs <= torch_graphs


def test_each_instance_computes_with_its_own_parameters_and_gets_its_own_gradients():
    torch.manual_seed(0)
    layers = [Layer() for _ in range(3)]
    references = copy.deepcopy(layers)
    backend = CountingBackend()
    compiled = kiln.compile(lambda layer, x: layer(x).sum(), backend=backend)
    x = torch.randn(3, 4)
    for layer, reference in zip(layers, references):
        compiled(layer, x).backward()
        reference(x).sum().backward()
    for layer, reference in zip(layers, references):
        assert_same(layer.fc.weight.grad, reference.fc.weight.grad)
        assert_same(layer.fc.bias.grad, reference.fc.bias.grad)
    assert backend.graphs == 1


class Masked(nn.Module):
    """A tensor kept as a plain attribute (neither parameter nor buffer): a graph input like a parameter."""

    def __init__(self):
        super().__init__()
        self.mask = torch.randn(4) > 0

    def forward(self, x):
        return x * self.mask


def test_a_plain_tensor_attribute_is_each_instances_own():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    graphs, torch_graphs = graphs_for(call, [(Masked(), x) for _ in range(4)])
    assert graphs == 1 <= torch_graphs


def test_buffers_written_by_the_graph_are_each_instances_own():
    """BatchNorm in training mode updates its running statistics: the write goes to the instance called."""
    torch.manual_seed(0)
    norms = [nn.BatchNorm1d(4) for _ in range(3)]
    references = copy.deepcopy(norms)
    compiled = kiln.compile(call, backend=CountingBackend())
    for i, (norm, reference) in enumerate(zip(norms, references)):
        x = torch.randn(5, 4) + i
        assert_same(compiled(norm, x), reference(x))
    for norm, reference in zip(norms, references):
        assert_same(norm.running_mean, reference.running_mean)
        assert_same(norm.num_batches_tracked, reference.num_batches_tracked)


class Decoder(nn.Module):
    """transformers' decoders: the forward runs in a try/finally and a data-dependent branch breaks the graph,
    so kiln runs it eagerly and compiles the layers it calls (kiln/capture/eager_frames.py)."""

    def __init__(self, n=12):
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(n))

    def forward(self, x):
        outputs = []
        try:
            if x.sum() > 1e9:
                x = x * 0
            for layer in self.layers:
                x = layer(x)
            return x
        finally:
            outputs.clear()


@pytest.mark.allows_fallback("graph_break: the decoder breaks on a tensor's value inside a try block")
def test_the_layers_a_frame_run_eagerly_calls_share_one_graph():
    torch.manual_seed(0)
    model = Decoder()
    x = torch.randn(3, 4)
    graphs, torch_graphs = graphs_for(model, [(x,), (x,)])
    assert graphs <= torch_graphs
    assert kiln.fallbacks.counts().get("frame_limit", 0) == 0


@pytest.mark.parametrize("make", [
    pytest.param(lambda i: Layer(scale=i + 1), id="int attribute"),
    pytest.param(lambda i: Layer(scale=0.5 * (i + 1)), id="float attribute"),
    pytest.param(lambda i: Layer(act=("relu", "tanh")[i % 2]), id="str attribute"),
    pytest.param(lambda i: Layer(residual=i % 2 == 1), id="bool attribute"),
    pytest.param(lambda i: Layer(width=4 + i), id="parameter shape"),
    pytest.param(lambda i: Layer(bias=i % 2 == 0), id="parameter or None"),
    pytest.param(lambda i: Layer().to(torch.float64 if i % 2 else torch.float32), id="parameter dtype"),
    pytest.param(lambda i: Layer().requires_grad_(i % 2 == 0), id="requires_grad"),
])
def test_an_instance_that_differs_in_what_the_code_read_recompiles(make):
    torch.manual_seed(0)
    layers = [make(i) for i in range(3)]
    calls = [(layer, torch.randn(3, layer.fc.in_features, dtype=layer.fc.weight.dtype)) for layer in layers]
    graphs, torch_graphs = graphs_for(call, calls + calls)  # the second round reuses each instance's entry
    assert 1 < graphs <= torch_graphs


class Block(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.act = act

    def forward(self, x):
        return self.act(x) + 1


@pytest.mark.parametrize("acts", [
    pytest.param((nn.ReLU(), nn.Tanh()), id="submodule of another class"),
    pytest.param((nn.LeakyReLU(0.1), nn.LeakyReLU(0.3)), id="submodule attribute"),
    pytest.param((nn.Dropout(0.0), nn.Dropout(0.0).eval()), id="submodule training flag"),
])
def test_submodules_that_differ_recompile(acts):
    x = torch.randn(3, 4)
    graphs, torch_graphs = graphs_for(call, [(Block(act), x) for act in acts] * 2)
    assert graphs == 2 and graphs <= torch_graphs


def test_eval_and_train_instances_compute_as_eager():
    torch.manual_seed(0)
    train, evaluating = Block(nn.Dropout(1.0)), Block(nn.Dropout(1.0))
    evaluating.eval()
    x = torch.randn(3, 4)
    compiled = kiln.compile(call, backend=CountingBackend())
    assert_same(compiled(train, x), torch.ones(3, 4))  # every element dropped
    assert_same(compiled(evaluating, x), x + 1)
    evaluating.train()
    assert_same(compiled(evaluating, x), torch.ones(3, 4))


def test_a_hook_on_one_instance_runs_for_that_instance_only():
    """torch.compile (2.13) runs the hooked instance with the graph of the hook-free one, leaving its hook out
    (a wrong answer): its single graph is no bound here, eager is."""
    torch.manual_seed(0)
    hooked, plain = Layer(), Layer()
    hooked.register_forward_hook(lambda module, args, out: out * 10)
    x = torch.randn(3, 4)
    backend = CountingBackend()
    compiled = kiln.compile(call, backend=backend)
    for layer in (plain, hooked, plain, hooked):
        assert_same(compiled(layer, x), layer(x))
    assert backend.graphs == 2


class Keyed(nn.Module):
    def __init__(self, names):
        super().__init__()
        self.parts = nn.ModuleDict({name: nn.Linear(4, 4) for name in names})

    def forward(self, x):
        return sum(part(x) * len(name) for name, part in self.parts.items())


def test_a_module_dict_with_other_keys_recompiles():
    x = torch.randn(3, 4)
    models = [Keyed(["a", "bb"]), Keyed(["a", "ccc"]), Keyed(["a", "bb"])]
    graphs, torch_graphs = graphs_for(call, [(m, x) for m in models])
    assert graphs == 2 and graphs <= torch_graphs


class Pair(nn.Module):
    """Two slots that may hold one module (tied) or two: a counter kept on the module tells them apart."""

    def __init__(self, first, second):
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x):
        self.first.calls += 1
        self.second.calls += 1
        return x * self.first.calls + self.second.calls


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0


def test_a_module_shared_by_two_slots_is_told_from_two_modules():
    x = torch.ones(2)
    shared = Counter()
    eager_pairs = [Pair(Counter(), Counter()), Pair(shared, shared)]
    compiled_pairs = copy.deepcopy(eager_pairs)
    compiled = kiln.compile(call, backend=CountingBackend())
    for pair, reference in zip(compiled_pairs, eager_pairs):
        assert_same(compiled(pair, x), reference(x))
        assert (pair.first.calls, pair.second.calls) == (reference.first.calls, reference.second.calls)


def test_instances_past_the_recompile_limit_still_compile():
    """Twelve layers whose int attribute differs need twelve entries: the recompile limit counts the entries
    compiled for each instance, so none of them falls back to eager (strict mode would raise)."""
    layers = [Layer(scale=i + 1) for i in range(12)]
    x = torch.randn(3, 4)
    backend = CountingBackend()
    compiled = kiln.compile(call, backend=backend)
    for layer in layers:
        assert_same(compiled(layer, x), layer(x))
    assert backend.graphs == 12


def test_kiln_compile_of_each_instance_with_one_backend_shares_the_entry():
    """`kiln.compile(layer)` per layer, one backend object: the calls share one compile context, as torch.compile's
    cache is keyed by the backend, so the backend sees one graph."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    layers = [Layer() for _ in range(6)]
    backend, torch_backend = CountingBackend(), CountingBackend()
    x = torch.randn(3, 4)
    for layer in layers:
        assert_same(kiln.compile(layer, backend=backend)(x), layer(x))
        torch.compile(layer, backend=torch_backend)(x)
    assert backend.graphs == 1 <= torch_backend.graphs


def test_the_default_backend_captures_a_layer_class_once_for_every_instance(fresh_cache, monkeypatch):
    """With the default backend named by its string, the kiln.compile calls share one context, as torch.compile's
    calls with `backend="inductor"` and the same options share their cache entries: the second layer runs the
    entry captured for the first, nothing is captured or traced again (training: the backward too)."""
    from kiln.autograd import aot, aot_cache

    traces = []
    for name in ("trace_joint", "trace_forward"):
        traced = getattr(aot, name)
        monkeypatch.setattr(aot, name, lambda *a, _traced=traced, _name=name, **k: traces.append(_name)
                            or _traced(*a, **k))
    torch.manual_seed(0)
    layers = [Layer() for _ in range(3)]
    references = copy.deepcopy(layers)
    x = torch.randn(3, 4)
    hits = aot_cache.stats["hits"]
    compiled = []
    for layer, reference in zip(layers, references):
        compiled.append(kiln.compile(layer))
        compiled[-1](x).sum().backward()
        reference(x).sum().backward()
        assert_same(layer.fc.weight.grad, reference.fc.weight.grad)
    assert traces == ["trace_joint"] and aot_cache.stats["hits"] == hits
    assert len({id(context_of(c)) for c in compiled}) == 1 and graph_count(context_of(compiled[0])) == 1


# a counting backend registered by name with kiln and with torch (each its own counter), taking the `mode` and
# `options` keywords both pass a named backend
COUNTED = "kiln_test_counted"
KILN_COUNTER, TORCH_COUNTER = CountingBackend(), CountingBackend()
kiln.register_backend(lambda gm, example_inputs, options=None: KILN_COUNTER(gm, example_inputs), name=COUNTED,
                      takes_options=True)
torch._dynamo.register_backend(lambda gm, example_inputs, **kwargs: TORCH_COUNTER(gm, example_inputs),
                               name=COUNTED)


def _graphs_by_name(layers, x, settings) -> tuple[int, int]:
    """Compile each layer with its own kiln.compile call and its own torch.compile call, with the `settings`
    (keyword arguments) of its turn, and compare with eager: the graphs each backend saw."""
    torch._dynamo.reset()
    KILN_COUNTER.graphs = TORCH_COUNTER.graphs = 0
    for layer, kwargs in zip(layers, settings):
        assert_same(kiln.compile(layer, backend=COUNTED, **kwargs)(x), layer(x))
        torch.compile(layer, backend=COUNTED, **kwargs)(x)
    torch._dynamo.reset()
    return KILN_COUNTER.graphs, TORCH_COUNTER.graphs


SETTINGS = {
    "one name": [{}] * 4,
    "one name, equal options": [{"options": {"trace.enabled": True}}] * 4,
    "options that differ": [{}, {"options": {"trace.enabled": True}}] * 2,
    "dynamic that differs": [{}, {"dynamic": False}] * 2,
}


@pytest.mark.parametrize("settings", SETTINGS)
def test_compiles_naming_one_backend_share_as_torch_compiles_do(settings):
    """A backend named by its string (and the same mode and options) shares the captures of every kiln.compile
    call naming it, as torch.compile's calls share their cache entries: one graph for many layers. Calls whose
    options or `dynamic` differ each compile their own, as under torch.compile."""
    torch.manual_seed(0)
    layers = [Layer() for _ in range(4)]
    graphs, torch_graphs = _graphs_by_name(layers, torch.randn(3, 4), SETTINGS[settings])
    assert graphs == torch_graphs


def test_each_backend_name_compiles_its_own():
    """Two names are two backends: each sees the layer class's graph once."""
    torch.manual_seed(0)
    layers = [Layer() for _ in range(4)]
    x = torch.randn(3, 4)
    compiled = [kiln.compile(layer, backend=name) for layer, name in zip(layers, ["eager", COUNTED] * 2)]
    KILN_COUNTER.graphs = 0
    for layer, fn in zip(layers, compiled):
        assert_same(fn(x), layer(x))
    assert KILN_COUNTER.graphs == 1 and context_of(compiled[0]) is context_of(compiled[2])
    assert context_of(compiled[0]) is not context_of(compiled[1])


def test_fullgraph_calls_do_not_run_entries_captured_without_it():
    """torch.compile's cache entries do not record `fullgraph`: a `fullgraph=True` call runs an entry another call
    captured with breaks, and raises nothing. kiln keeps the two apart (a context each), one graph more."""
    torch.manual_seed(0)
    layers = [Layer() for _ in range(4)]
    graphs, torch_graphs = _graphs_by_name(layers, torch.randn(3, 4), [{}, {"fullgraph": True}] * 2)
    assert graphs == torch_graphs + 1 == 2
