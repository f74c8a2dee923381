"""Real model graphs compiled for the GPU on a machine without one: fake CUDA tensors, kiln's pipeline, no launch.

kiln picks its Triton target by the device of a graph's tensors. On a CPU-only build of torch, fake tensors
(`FakeTensorMode`) can say `device='cuda'`, and ATen ops on them run their meta functions; two things still
reach for a CUDA runtime that is not there:

- Python indexing (`x[:, :1]`, `x[0] = v`) holds a device guard for the tensor's device, and a CPU-only build
  registers none for CUDA ("PyTorch is not linked with support for cuda devices"). `allow_fake_cuda()` builds
  and loads once a tiny library that registers c10's no-op guard for CUDA (what the CPU and meta devices use).
- The autograd engine asks for the accelerator's streams when a backward reaches a CUDA tensor ("Cannot access
  accelerator device when none is available"), so a joint forward+backward cannot be traced on fake CUDA
  tensors.

So a model is compiled in three steps, the way kiln compiles it on a GPU except for where the autograd trace
runs:

1. `forward_graph`: the model's forward (`functional_call` over its parameters and buffers, which become graph
   inputs) traced to ATen on fake CUDA tensors, with CUDA's autocast policy when `amp` (its casts are ops of
   the graph then, as kiln's own trace would record them) and `torch.compiler.is_compiling()` true, as under
   kiln's capture (libraries take their trace-friendly paths).
2. That graph moved to the CPU (`on_device`) and handed to kiln's AOT stage (`kiln.autograd.aot_compile`), which
   traces the inference graph, or the joint and its partition into forward and backward.
3. Each ATen graph moved back to CUDA before kiln's code generator compiles it (`compile_aten_graph`): the
   Triton target, GPU lowering rules (matmul padding, channels-last convolutions), kernels loaded but not
   launched. `tests/support/triton_sm90.py` records what would be compiled and compiles it for sm_90.

`compile_model` returns kiln's CompiledGraphs; they are never called.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import subprocess
from pathlib import Path
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.config import cache_dir

_GUARD_SOURCE = """#include <c10/core/impl/DeviceGuardImplInterface.h>
C10_REGISTER_GUARD_IMPL(CUDA, c10::impl::NoOpDeviceGuardImpl<c10::DeviceType::CUDA>)
"""
_guard_loaded = False


def allow_fake_cuda() -> None:
    """Let Python indexing run on fake CUDA tensors (see the module docstring). A no-op where CUDA is built in."""
    global _guard_loaded
    if _guard_loaded or torch.backends.cuda.is_built():
        return
    torch_dir = Path(torch.__file__).parent
    flags = ["-std=c++17", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
             f"-I{torch_dir / 'include'}", f"-L{torch_dir / 'lib'}", "-lc10"]
    key = hashlib.sha256((_GUARD_SOURCE + torch.__version__ + " ".join(flags)).encode()).hexdigest()[:16]
    library = cache_dir() / "test_support" / f"cuda_noop_guard_{key}.so"
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        source = library.with_suffix(".cpp")
        source.write_text(_GUARD_SOURCE)
        partial = library.with_suffix(f".{id(source)}.tmp")
        subprocess.run(["g++", str(source), "-o", str(partial), *flags], check=True, capture_output=True)
        partial.rename(library)
    ctypes.CDLL(str(library))
    _guard_loaded = True


@contextlib.contextmanager
def cuda_autocast(dtype: torch.dtype | None):
    """CUDA autocast to `dtype` (None: off). `torch.autocast('cuda')` turns itself off on a machine without
    CUDA, so the state is set directly."""
    if dtype is None:
        yield
        return
    enabled, previous = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", previous)


def fake_like(mode: FakeTensorMode, t: torch.Tensor, device: str, requires_grad: bool = False) -> torch.Tensor:
    """A fake tensor of `mode` with `t`'s sizes, strides and dtype on `device`."""
    with mode:
        fake = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
    return fake.requires_grad_(requires_grad) if requires_grad else fake


def forward_graph(model: torch.nn.Module, inputs: list[torch.Tensor], amp: torch.dtype | None, train: bool,
                  cpu_inputs: tuple[int, ...] = ()):
    """(ATen graph of `model(*inputs)` over (inputs, parameters, buffers) on fake CUDA tensors, those inputs).

    `inputs` (CPU tensors) and the model's parameters give sizes, strides and dtypes only; the inputs numbered in
    `cpu_inputs` are fake CPU tensors, the rest fake CUDA tensors. With `train` the
    parameters require grad while tracing, as in a training step: composite ops choose their kernel by it
    (on a real GPU, attention picks cuDNN only where its bias needs no gradient)."""
    allow_fake_cuda()
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    state = [p for _, p in model.named_parameters()] + [b for _, b in model.named_buffers()]
    mode = FakeTensorMode()
    fakes = [fake_like(mode, t, "cpu" if k in cpu_inputs else "cuda") for k, t in enumerate([*inputs, *state])]
    for fake, (_, p) in zip(fakes[len(inputs):], model.named_parameters()):
        fake.requires_grad_(train and p.requires_grad)

    def forward(*flat):
        return torch.func.functional_call(model, dict(zip(names, flat[len(inputs):])), tuple(flat[:len(inputs)]))

    with mode, cuda_autocast(amp), mock.patch("torch.compiler.is_compiling", lambda: True), \
            torch.set_grad_enabled(train):
        return make_fx(forward)(*fakes), [f.detach() for f in fakes]


def on_device(gm: torch.fx.GraphModule, inputs: list, device: str) -> tuple[torch.fx.GraphModule, list]:
    """`gm` and fake `inputs` moved to `device`: its device constants rewritten and its views made reshapes, then
    re-traced on fake tensors (fresh `meta['val']`s), keeping the graph's own metadata (what kiln's AOT stage put
    there) and each input's requires_grad."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    target = torch.device(device if ":" in device or device == "cpu" else f"{device}:0")
    for node in graph.nodes:
        if node.target in _VIEWS:  # a layout an op has on one device only: reshape copies where view cannot
            node.target = torch.ops.aten.reshape.default
        node.args = _moved(node.args, target)
        node.kwargs = _moved(node.kwargs, target)
    moved = torch.fx.GraphModule(gm, graph)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [fake_like(mode, t, str(target), t.requires_grad) if isinstance(t, torch.Tensor) else t for t in inputs]
    for name, value in list(moved.named_buffers()) + list(moved.named_parameters()):
        _set_attr(moved, name, fake_like(mode, value, str(target)))
    for name, value in list(vars(moved).items()):
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
            setattr(moved, name, fake_like(mode, value, str(target)))
    with mode, torch.no_grad():
        traced = make_fx(moved)(*[f.detach() if isinstance(f, torch.Tensor) else f for f in fakes])
    traced.meta.update(gm.meta)
    return traced, fakes


# Some ops' fake results have other strides on CUDA than on the CPU; a view valid on one device may not be on
# the other. On its own device the re-trace turns each reshape back into a view.
_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def _moved(value, device: torch.device):
    """`value` (node arguments) with every torch.device replaced by `device`."""
    if isinstance(value, torch.device):
        return device
    return torch.fx.node.map_aggregate(value, lambda v: device if isinstance(v, torch.device) else v)


def _set_attr(module: torch.nn.Module, dotted: str, value) -> None:
    owner, _, name = dotted.rpartition(".")
    target = module.get_submodule(owner) if owner else module
    delattr(target, name)
    setattr(target, name, value)


def compile_model(model: torch.nn.Module, inputs: list[torch.Tensor], *, train: bool, amp: torch.dtype | None,
                  name: str = "graph") -> list:
    """kiln's CompiledGraphs for `model(*inputs)` on fake CUDA tensors (the steps of the module docstring):
    the inference graph, or with `train` the forward and backward of `model`'s output (a loss) with respect to
    its parameters. `name` starts the graphs' names (`{name}/forward`)."""
    from kiln.autograd import aot_compile
    from kiln.lower.decompositions import decomposition_table
    from kiln.pipeline import compile_aten_graph, fuses

    gm, fakes = forward_graph(model, inputs, amp, train)
    cpu_gm, cpu_inputs = on_device(gm, fakes, "cpu")
    if train:
        first_param = len(inputs)
        for t, (_, p) in zip(cpu_inputs[first_param:], model.named_parameters()):
            t.requires_grad_(p.requires_grad)
    graphs = []

    def compiler(aten_gm, example_inputs):
        graphs.append(compile_aten_graph(*on_device(aten_gm, example_inputs, "cuda")))
        return graphs[-1]

    compiler.fuses = fuses
    with torch.set_grad_enabled(train):
        aot_compile(cpu_gm, cpu_inputs, compiler, decompositions=decomposition_table(), name=name)
    return graphs


def compile_inference(model: torch.nn.Module, inputs: list[torch.Tensor], cpu_inputs: tuple[int, ...] = ()):
    """kiln's CompiledGraph for `model(*inputs)` under no_grad on fake CUDA inputs, traced where it runs: no
    autograd engine is involved, so the graph is not moved through the CPU, and the tensors the model makes
    without a device (`torch.rand(())`, `torch.full((4,), 0.5)`) stay CPU tensors, as in eager; so do the inputs
    numbered in `cpu_inputs`."""
    from kiln.autograd import aot_compile
    from kiln.lower.decompositions import decomposition_table
    from kiln.pipeline import compile_aten_graph, fuses

    gm, fakes = forward_graph(model, inputs, None, train=False, cpu_inputs=cpu_inputs)
    graphs = []

    def compiler(aten_gm, example_inputs):
        graphs.append(compile_aten_graph(aten_gm, example_inputs))
        return graphs[-1]

    compiler.fuses = fuses
    with torch.no_grad():
        aot_compile(gm, fakes, compiler, decompositions=decomposition_table(), name="graph")
    (graph,) = graphs
    assert "fallback" not in graph.artefacts, graph.artefacts["fallback"]
    return graph
