"""Is eager's own answer stable where kiln differs? Programs whose value depends on eager's kernels.

Some values are not a property of the program but of the kernel that computed them: `gelu(inf)` is
nan on eager's vectorized CPU path and inf on its scalar path; `argmax` over sums that tie but for
one ulp picks whichever the summation order favours. kiln differing from eager there is no bug.

The test of that is eager against itself: the same program, called with the same input values laid
out differently (non-contiguous, column-major) or in float64, runs other kernels and summation orders.
The re-laid runs re-lay the module parameters, buffers and optimizer state the program reads as well, so
a float32 parameter's sum is summed in another order too. Where kiln differs from eager, every differing
position must be one where some such eager run differs from eager too, and kiln's value must be one eager
gave there (for floats: within the range eager's runs span), or one of the float64 cases below. Then the
program is "ill-conditioned" at those positions, a status of its own, with the reason printed; otherwise
the difference stays "wrong".

One run is a reference rather than another of eager's answers: "float64 arithmetic" runs the program
with every float32 value in float64 (inputs, `.float()`, `dtype=torch.float32`, the default dtype of
factories and of int-to-float promotion; bf16 and fp16 stay, so their roundings are still checked), and
every float32 tensor it reads besides its inputs too: module parameters, buffers and their `.grad`,
optimizer state, tensors its globals hold (`world_changed`, on a fresh copy of the program). Judged by it:

- kiln's value is the float64 value's within the dtype's tolerance: right, whatever eager's;
- kiln's value is no farther from the float64 value than one of eager's own answers (its value, a re-laid
  run's): a float32 parameter's sum that nearly cancels, summed in three orders, lands on three values;
- eager's float32 value and kiln's are both off from the float64 value beyond the tolerance: float32 cannot
  compute that value, each answer is the rounding noise of one summation order (a mean of int64 edge values
  cancels catastrophically: exactly -1.56, float64 -1.33, eager float32 -1.44, kiln 0). kiln's value is
  accepted if it is of the value's scale, within twice the larger of the float64 value's magnitude and
  eager's distance from it (a kiln answer of 1e30 stays wrong). Where eager's value is inf or NaN and the
  float64 value is a finite float32, an intermediate overflowed (a LayerNorm over a row near 1e30: eager
  gives NaN there, and 0 on a row near 1e19, where the value is of order 1): within twice the largest of the
  true values where eager's overflowed (a Linear after the LayerNorm mixes the row: one of its outputs may be
  near 0, and kiln's, the Linear's bias, is of the row's scale).

A program that reads a dtype (`if t.dtype == torch.float32`) may take another path in float64, so that
run is dropped.

One more of eager's answers comes from another process: eager with ATen's CPU kernels built without vector
instructions (`ATEN_CPU_CAPABILITY=default`, what eager runs on a CPU without AVX2). An elementwise CPU kernel
of eager's runs a vectorized loop over most of a contiguous tensor and a scalar loop over the rest (a tail, a
tensor shorter than a vector, strided operands), and the two loops fix what IEEE leaves open differently: a
float NaN converted to bf16 is 0xffff in the vector loop and 0x7fc0 in the scalar one, a fp16 NaN's sign can
differ. Which one a program sees depends on where the element sits in the tensor, and the re-laid runs above
move most elements into the scalar loop but not all (a column-major copy of a row vector is contiguous still).
The process without vector kernels runs every element through the scalar loop. It starts only when a difference
is being judged, and only for programs on the CPU.

A GPU program gets one more of eager's answers from eager's CPU kernels: the program with its tensors made on
the CPU. Where CUDA's eager and the CPU's disagree and kiln's value is one of theirs, the value depends on the
kernel (a fp16 `lerp` whose last bit, seen through `.view(torch.int16)`, is summed into a product: GPU fuzz seed
490194), where a GPU program's re-laid runs alone rarely move it.

One more of eager's answers runs the program's function with `torch.compiler.is_compiling()` true: library
code that branches on it computes otherwise under any compiler, kiln's capture included, whose traced code takes
that branch (an optimizer stepped inside the function computes its bias corrections as float32 tensor ops, not
Python floats: fuzz seed 461874, Adam stepped inside the compiled function, a gradient 1e-6 off after two steps).

The last of eager's answers measure what float32 rounding alone does to a value (Monte Carlo arithmetic): eager
again, each float32 result of an op that rounds (`ROUNDING_OPS`: arithmetic, reductions, matmuls, norms and their
backwards) moved by up to one unit in the last place, at random, forward, backward and optimizer step alike, once
per seed of `NOISE_SEEDS`. A value that moves past the tolerance then is float32's rounding noise, whatever kernel
computes it: a BatchNorm over a batch of equal rows normalizes differences of one ulp by sqrt(eps), and the
gradient it passes to the Linear before it, exactly 0 in exact arithmetic, is eager's rounding noise, 0 or 4e-5 by
element, 5e-4 once perturbed (fuzz seed 104347). Re-laid inputs do not show it: the rows are the program's
intermediates, not its inputs. Ops whose float results are exact (copies, views, max, floor, where) are left
alone: a value that is exact in every implementation is not noise. A few runs sample that noise without reaching
its ends, so where it moves a value, kiln's is accepted within their span widened by its width on each side.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import select
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from tests.fuzz import runtime
from tests.fuzz.compare import call_once, close_mask, gradients, leaves, load, storage_of


def _dense_strides(shape, order, gap: int) -> list[int]:
    """Strides of a dense layout that walks the dims in `order` (innermost first), `gap` apart."""
    strides, step = [0] * len(shape), gap
    for d in order:
        strides[d] = step
        step *= max(shape[d], 1)
    return strides


def _relaid(t: torch.Tensor, gap: int) -> torch.Tensor:
    """`t`'s values in a column-major layout with `gap`-element holes: a leaf with t's requires_grad."""
    if t.dim() == 0:
        return t.detach().clone().requires_grad_(t.requires_grad)
    out = torch.empty_strided(t.shape, _dense_strides(t.shape, range(t.dim()), gap), dtype=t.dtype, device=t.device)
    with torch.no_grad():
        out.copy_(t)
    return out.requires_grad_(t.requires_grad)


def _float64(t: torch.Tensor) -> torch.Tensor:
    if not t.dtype.is_floating_point:
        return t
    return t.detach().double().requires_grad_(t.requires_grad)


class DtypeRead(Exception):
    """The program read a tensor's dtype under `Float64Arithmetic`: its float64 run may take another path."""


class Float64Arithmetic(TorchFunctionMode):
    """The program's float32 as float64: each request for float32 (`.float()`, `.to(torch.float32)`,
    `dtype=torch.float32`) asks for float64, and the default dtype is float64 while the mode is on. A read
    of a dtype raises DtypeRead."""

    WIDER = {torch.Tensor.float: torch.Tensor.double}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__self__", None) is torch.Tensor.dtype:
            raise DtypeRead("the program reads a dtype")
        widen = lambda v: torch.float64 if v is torch.float32 else v  # noqa: E731
        return self.WIDER.get(func, func)(*tree_map(widen, args), **tree_map(widen, kwargs or {}))

    def __enter__(self):
        self.default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.set_default_dtype(self.default)
        return super().__exit__(*exc)


# ops whose float result is rounded (the packet's name; every `*_backward` besides these too): `RoundingNoise` moves it
ROUNDING_OPS = frozenset({
    "add", "sub", "rsub", "mul", "div", "addcmul", "addcdiv", "lerp", "pow", "exp", "exp2", "expm1", "log", "log1p",
    "log2", "log10", "sqrt", "rsqrt", "reciprocal", "sigmoid", "tanh", "sin", "cos", "tan", "asin", "acos", "atan",
    "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "gelu", "silu", "softplus", "elu",
    "mish", "hypot", "remainder", "sum", "mean", "var", "std", "var_mean", "std_mean", "prod", "norm",
    "linalg_vector_norm", "cumsum", "cumprod", "logsumexp", "_softmax", "_log_softmax", "mm", "bmm", "addmm",
    "baddbmm", "mv", "dot", "matmul", "linear", "convolution", "_convolution", "native_batch_norm",
    "_native_batch_norm_legit", "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
    "native_layer_norm", "native_group_norm", "_fused_rms_norm", "mse_loss", "binary_cross_entropy",
    "nll_loss_forward", "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math",
})
EXACT_BACKWARDS = frozenset({"threshold_backward", "hardtanh_backward", "max_pool2d_with_indices_backward"})


def rounds(func) -> bool:
    """Is `func`'s float result rounded (so float32 rounding noise is a property of it)? Not a view, nor an op
    that writes its inputs (an in-place op's result is its input)."""
    schema = func._schema
    if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
        return False
    name = func.overloadpacket.__name__
    return name in ROUNDING_OPS or (name.endswith(("_backward", "_backward_data")) and name not in EXACT_BACKWARDS)


class RoundingNoise(TorchDispatchMode):
    """Each float32 result of an op that rounds (`rounds`), times 1 + u * 2**-23 with u uniform in [-1, 1] from
    this mode's own generator (the program's draws are untouched): float32's rounding, once more, at random."""

    def __init__(self, seed: int):
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return tree_map(self._moved, out) if rounds(func) else out

    def _moved(self, value):
        if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
            return value
        u = torch.rand(value.shape, generator=self.generator).to(value.device) * 2 - 1
        return value * (1 + u * 2.0 ** -23)


def _float64_of_float32(t: torch.Tensor) -> torch.Tensor:
    """float32 as float64, a leaf with t's requires_grad; bf16 and fp16 stay, their roundings are the program's."""
    return t.detach().double().requires_grad_(t.requires_grad) if t.dtype == torch.float32 else t


def _map_module(module: torch.nn.Module, change: Callable) -> torch.nn.Module:
    # `_apply` keeps each Parameter object (its `.data` and `.grad` change), so an optimizer built over
    # `MODEL.parameters()` still steps the module's parameters
    return module._apply(change)


def _map_optimizer(opt: torch.optim.Optimizer, change: Callable) -> torch.optim.Optimizer:
    for state in opt.state.values():
        _map_dict(state, change)
    return opt


def _map_dict(d: dict, change: Callable) -> dict:
    for key, value in d.items():
        d[key] = _mapped(value, change)
    return d


def _map_list(items: list, change: Callable) -> list:
    items[:] = [_mapped(v, change) for v in items]
    return items


# how each kind of value a program's globals hold changes; containers change in place, keeping their identity
WORLD_RULES: list[tuple[type, Callable]] = [
    (torch.nn.Module, _map_module), (torch.optim.Optimizer, _map_optimizer),
    (torch.Tensor, lambda t, change: change(t)), (dict, _map_dict), (list, _map_list),
    (tuple, lambda t, change: type(t)(_mapped(v, change) for v in t)),
]


def _mapped(value, change: Callable):
    for kind, rule in WORLD_RULES:
        if isinstance(value, kind) and not isinstance(value, type):
            return rule(value, change)
    return value


def world_changed(change: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[dict], None]:
    """A re-run's change of the program's world: `change` applied to every tensor its globals hold (module
    parameters and buffers and their `.grad`, optimizer state, tensors in globals and in the containers they
    name), in the fresh copy of the program that `eager_rerun` loads, never the namespace under test."""
    def change_world(ns: dict) -> None:
        for name in [n for n in ns if not n.startswith("__")]:
            ns[name] = _mapped(ns[name], change)
    return change_world


@dataclass(frozen=True)
class Variant:
    """One of eager's re-runs: how each tensor input changes, how the program's globals change before the
    call (`world`), what the program's function runs under (`arithmetic`), what the whole re-run runs under
    (`whole_call`: the earlier calls replayed, whose gradients and steps the state carries, and the call, its
    backward and step), and the ATen CPU capability of the process it runs in ("": this process's)."""
    change: Callable[[torch.Tensor], torch.Tensor]
    arithmetic: Callable = field(default=contextlib.nullcontext)
    world: Callable[[dict], None] = field(default=lambda ns: None)
    cpu_capability: str = ""
    whole_call: Callable = field(default=contextlib.nullcontext)
    compile_path: bool = False  # the program's function, in every call, with torch.compiler.is_compiling() true
    on_the_cpu: bool = False  # a GPU program's inputs made on the CPU, and run there (None for a CPU program)


def _unchanged(t: torch.Tensor) -> torch.Tensor:
    return t


FLOAT64_REFERENCE = "float64 arithmetic"
SCALAR_KERNELS = "CPU kernels without vector instructions"
# eager's re-runs: the same values, other kernels; and the program computed in float64 (the reference)
VARIANTS: dict[str, Variant] = {
    "column-major inputs": Variant(lambda t: _relaid(t, 1), world=world_changed(lambda t: _relaid(t, 1))),
    "non-contiguous inputs": Variant(lambda t: _relaid(t, 2), world=world_changed(lambda t: _relaid(t, 2))),
    "float64 inputs": Variant(_float64),
    FLOAT64_REFERENCE: Variant(_float64, Float64Arithmetic, world_changed(_float64_of_float32)),
    SCALAR_KERNELS: Variant(_unchanged, cpu_capability="default"),
    "eager's CPU kernels": Variant(_unchanged, on_the_cpu=True),
    "library code on its compile path": Variant(_unchanged, compile_path=True),
}
NOISE_SEEDS = range(4)
NOISE_RUNS = tuple(f"float32 rounding noise {seed}" for seed in NOISE_SEEDS)
VARIANTS.update({name: Variant(_unchanged, whole_call=functools.partial(RoundingNoise, seed))
                 for name, seed in zip(NOISE_RUNS, NOISE_SEEDS)})


MAKERS = ("randn", "ints", "bools")
"""The input makers of `runtime` a program's `inputs` may call. Inputs that share storage (`d = b[::2]`) are
changed where they are made: the makers' tensors are, and the views the program derives from them follow."""


def call_and_gradients(ns: dict, fn: Callable, call: int):
    """(args, the inputs' `.grad` after a backward over the outputs, exception) of one call."""
    args, result, error = call_once(ns, fn, call)
    if error is not None:
        return args, result, error
    grads, error = gradients(result, args, call)
    return args, grads, error


def call_and_inputs(ns: dict, fn: Callable, call: int):
    """(args, the inputs after the call (written in place), exception) of one call."""
    args, _, error = call_once(ns, fn, call)
    return args, args, error


def state_after(stage: int) -> Callable:
    """One call, then as `compare.compare_call` goes on (stage 1: the backward over its outputs, 2: and the
    program's `after_call`): (args, the program's Python state then, exception)."""
    def run(ns: dict, fn: Callable, call: int):
        args, result, error = call_once(ns, fn, call)
        if error is None and stage >= 1 and not ns.get("NO_GRAD"):
            gradients(result, args, call)
        if stage >= 2 and "after_call" in ns:
            ns["after_call"](call)
        return args, runtime.python_state(ns), error
    return run


# what a re-run returns: the call's result ("values"), the inputs' gradients after its backward, the inputs after
# the call, or the Python state after the call, after its backward or after the program's step
RUN_CALLS: dict[str, Callable] = {"values": call_once, "gradients": call_and_gradients, "inputs": call_and_inputs,
                                  "state": state_after(0), "state after backward": state_after(1),
                                  "state after the step": state_after(2)}


def eager_results(source: str, call: int, what: str) -> dict:
    """Variant name -> eager's result (`what`: "values" or "gradients") of call `call` under that variant (None:
    it raised, or the variant does not apply)."""
    return {name: eager_rerun(source, call, variant, what) for name, variant in VARIANTS.items()}


def eager_rerun(source: str, call: int, variant: Variant, what: str):
    """The result of eager's call `call` of a fresh copy of the program (earlier calls replayed as the run under
    test made them, for the state they leave), its world and tensor inputs changed and the call run as
    `variant` says; None when it raised."""
    if variant.cpu_capability:
        return _rerun_in_process_with(variant.cpu_capability, source, call, what)
    if variant.on_the_cpu:
        return _on_the_cpu(source, call, what)
    ns = load(source)
    if variant.compile_path:
        ns["f"] = _under(_compiling, ns["f"])
    change = variant.change
    # warnings of the changed world (a re-laid parameter's gradient layout) are not the program's
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings(), variant.whole_call():
        warnings.simplefilter("ignore")
        for earlier in range(call):
            replay_call(ns, earlier)
        variant.world(ns)
        made = ns["inputs"]
        args = made(call)
        if _shares_storage(args):  # relaid copies of each would not alias as the program's inputs do
            for name in MAKERS:
                ns[name] = _changed(ns[name], change)
        else:
            ns["inputs"] = lambda c: [change(a) if isinstance(a, torch.Tensor) else a for a in args]
        _, result, error = RUN_CALLS[what](ns, _under(variant.arithmetic, ns["f"]), call)
    return None if error is not None else result


ROOT = Path(__file__).resolve().parents[2]
RERUN_TIMEOUT = 120  # seconds: a Python start, torch's import and one program

# (CPU capability, thread count, the asking process) -> the process that re-runs programs with them. One process
# serves every program of the asking one: a fresh Python and torch import per program cost seconds each, most of
# the judge's time.
_RERUN_SERVERS: dict[tuple[str, int, int], subprocess.Popen] = {}


def _rerun_in_process_with(capability: str, source: str, call: int, what: str):
    """Eager's call in another Python process whose ATen dispatches to the kernels built for `capability`
    (`serve_reruns` runs there), with this process's thread count; its output tensors (`what` = "values") or
    the inputs' gradients, or None when it raised, failed or the program's tensors are not on the CPU. A
    server that dies or hangs on a program is stopped, and the next program gets a new one."""
    if runtime.DEVICE != "cpu":
        return None
    key = (capability, torch.get_num_threads(), os.getpid())
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.pt"
        server = _RERUN_SERVERS.get(key) or _start_rerun_server(*key)
        request = json.dumps({"source": source, "call": call, "what": what, "out": str(out)})
        try:
            server.stdin.write(request + "\n")
            server.stdin.flush()
            ready, _, _ = select.select([server.stdout], [], [], RERUN_TIMEOUT)
            answered = bool(ready) and server.stdout.readline() == "done\n"
        except OSError:
            answered = False
        if not answered:
            _stop_rerun_server(key)
            return None
        return torch.load(out) if out.exists() else None


def _start_rerun_server(capability: str, threads: int, asking: int) -> subprocess.Popen:
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fuzz"), "--serve-reruns"], env=env, cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    _RERUN_SERVERS[capability, threads, asking] = server
    return server


def _stop_rerun_server(key: tuple[str, int, int]) -> None:
    server = _RERUN_SERVERS.pop(key, None)
    if server is not None:
        server.kill()
        server.wait()


@atexit.register
def _stop_rerun_servers() -> None:
    for key in list(_RERUN_SERVERS):
        _stop_rerun_server(key)


def serve_reruns() -> None:
    """The other process's side of `_rerun_in_process_with`: one request per line on stdin (a JSON object: the
    program's source, the call, what to return, the file to save it to), "done" on stdout once it is saved
    (nothing saved when the call raised). Values are the output tensors in `leaves` order, gradients one per input
    (None where an input has none), detached; inputs and states their tensors in `leaves` order. What the programs
    print goes to stderr, so that stdout carries only the replies."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    for line in sys.stdin:
        request = json.loads(line)
        with contextlib.suppress(Exception):
            _serve_rerun(request["source"], request["call"], request["what"], request["out"])
        replies.write("done\n")
        replies.flush()


def _serve_rerun(source: str, call: int, what: str, out: str) -> None:
    result = eager_rerun(source, call, Variant(_unchanged), what)
    if result is None:
        return
    detached = [t.detach() if isinstance(t, torch.Tensor) else None
                for t in (result if what == "gradients" else leaves(result))]
    torch.save(detached, out)


def replay_call(ns: dict, call: int) -> None:
    """One earlier call of eager's run as `compare.compare_call` makes it: the call, the backward over its
    outputs (module parameters gain `.grad`, hooks run) and the program's `after_call` (an optimizer step)."""
    args, result, error = call_once(ns, ns["f"], call)
    if error is None and not ns.get("NO_GRAD"):
        gradients(result, args, call)
    if "after_call" in ns:
        ns["after_call"](call)


@contextlib.contextmanager
def _compiling():
    """`torch.compiler.is_compiling()` true, as library code sees it inside a compiler's capture."""
    original = torch.compiler.is_compiling
    torch.compiler.is_compiling = lambda: True
    try:
        yield
    finally:
        torch.compiler.is_compiling = original


def _under(arithmetic: Callable, fn: Callable) -> Callable:
    def run(*args):
        with arithmetic():
            return fn(*args)
    return run


def _shares_storage(args: list) -> bool:
    storages = [storage_of(a) for a in args if isinstance(a, torch.Tensor) and storage_of(a) is not None]
    return len(set(storages)) != len(storages)


def _on_the_cpu(source: str, call: int, what: str):
    """Eager's call of a GPU program with its tensors made on the CPU (see the module's docstring); None for a
    CPU program, or where the call raises (a tensor the program keeps on the GPU)."""
    if runtime.DEVICE == "cpu":
        return None
    device, runtime.DEVICE = runtime.DEVICE, "cpu"
    try:
        return eager_rerun(source, call, Variant(_unchanged), what)
    finally:
        runtime.DEVICE = device


def _changed(maker: Callable, change: Callable) -> Callable:
    def make(*args, **kwargs):
        return change(maker(*args, **kwargs))
    return make


def unstable_positions(e_res, k_res, reruns: dict) -> str | None:
    """Why kiln's differences from eager are no kiln bug, or None when one is not.

    `reruns`: variant name -> eager's result under it (None: it raised). Where kiln differs from eager, its
    value must be the float64 run's (the true value, within the dtype's tolerance: eager's is off from it
    beyond that), or eager must differ from itself there under some re-run and kiln hold a value eager's
    runs span (or float32's rounding noise, see `_float32_noise`).
    """
    e_leaves, k_leaves = leaves(e_res), leaves(k_res)
    if len(e_leaves) != len(k_leaves):
        return None
    reasons = []
    for i, (e, k) in enumerate(zip(e_leaves, k_leaves)):
        if e.shape != k.shape:
            return None
        # judged on the CPU, as `close_mask` judges: a CUDA program's outputs beside re-runs and masks on the CPU
        e, k = e.detach().cpu(), k.detach().cpu()
        differs = ~close_mask(e, k)
        if not differs.any():
            continue
        runs = {name: _leaf(r, i, e) for name, r in reruns.items()}
        runs = {name: v for name, v in runs.items() if v is not None}
        if not runs:
            return None
        unstable = {name: ~close_mask(e, v) for name, v in runs.items()}
        unexplained = differs & ~_true_value(k, runs, differs)
        if (unexplained & ~_any(unstable.values(), differs)).any():
            return None
        noise = (_float32_noise(e, k, runs, differs) | _as_near_as_eager(e, k, runs, differs)
                 | _within_noise_spread(e, k, runs, differs))
        if not (_within_eagers_span(e, k, list(runs.values()), differs) | noise)[unexplained].all():
            return None
        where = differs.nonzero()[0].tolist()
        names = [name for name, mask in unstable.items() if mask[tuple(where)]] or [FLOAT64_REFERENCE]
        reasons.append(f"output {i} at {where}: kiln {_at(k, where)}, eager {_at(e, where)}, and eager itself "
                       f"{', '.join(f'{_at(runs[n], where)} with {n}' for n in names)}")
    return "; ".join(reasons) or None


def _true_value(k: torch.Tensor, runs: dict, like: torch.Tensor) -> torch.Tensor:
    """Where kiln's value is the float64 reference run's within the dtype's tolerance: right, whatever eager's."""
    reference = runs.get(FLOAT64_REFERENCE)
    return close_mask(reference, k) if reference is not None else torch.zeros_like(like)


def _leaf(result, i: int, like: torch.Tensor) -> torch.Tensor | None:
    found = leaves(result) if result is not None else []
    if len(found) <= i or found[i].shape != like.shape:
        return None
    return found[i].detach().to(like.device, like.dtype)


def _any(masks, like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like, dtype=torch.bool)
    for m in masks:
        out |= m
    return out


def _within_eagers_span(e: torch.Tensor, k: torch.Tensor, runs: list[torch.Tensor], like: torch.Tensor):
    """Where kiln's value is one eager gave (NaN and inf included), or between eager's smallest and largest."""
    values = [e.detach()] + runs
    matches = _any([close_mask(v, k) for v in values], like)
    if k.dtype.is_floating_point:
        stacked = torch.stack([v.double() for v in values])
        k64 = k.detach().double()
        with contextlib.suppress(RuntimeError):
            matches |= (stacked.amin(0) <= k64) & (k64 <= stacked.amax(0))
    return matches


def _within_noise_spread(e: torch.Tensor, k: torch.Tensor, runs: dict, like: torch.Tensor):
    """Where float32 rounding noise moves eager's value past the tolerance and kiln's lies within the noise runs'
    span widened by its own width on each side. Four runs of one-ulp noise sample the values float32 rounding
    gives; they do not reach its ends: `sin` of an `exp` near 9300 moves by 7e-4 for each ulp of the exp, and
    eager on another CPU (another exp kernel) lands outside the four runs' span, as kiln's may (fuzz seed 401646).
    A value of another scale stays outside."""
    noisy = [runs[name] for name in NOISE_RUNS if name in runs]
    if not noisy or not k.dtype.is_floating_point:
        return torch.zeros_like(like)
    moved = _any([~close_mask(e, v) for v in noisy], like)
    stacked = torch.stack([v.double() for v in [e.detach(), *noisy]])
    low, high, k64 = stacked.amin(0), stacked.amax(0), k.detach().double()
    width = high - low
    return moved & torch.isfinite(width) & (low - width <= k64) & (k64 <= high + width)


def _float32_noise(e: torch.Tensor, k: torch.Tensor, runs: dict, like: torch.Tensor):
    """Where eager's value and kiln's are both off from the float64 reference run beyond their dtype's
    tolerance, and kiln's is finite and of the value's scale (see the module docstring). Eager's value may be
    inf or NaN where the reference is a finite value of the dtype: a float32 intermediate overflowed (a
    LayerNorm over a row near 1e30 squares it), and eager's answer measures no scale there."""
    reference = runs.get(FLOAT64_REFERENCE)
    if reference is None or not k.dtype.is_floating_point:
        return torch.zeros_like(like)
    x, e64, k64 = reference.double(), e.detach().double(), k.detach().double()
    both_off = ~close_mask(x, e) & ~close_mask(x, k) & torch.isfinite(x) & torch.isfinite(k64)
    scale = torch.where(torch.isfinite(e64), torch.maximum(x.abs(), (e64 - x).abs()), _overflowed_scale(x, e64))
    return both_off & ((k64 - x).abs() <= 2 * scale)


def _overflowed_scale(x: torch.Tensor, e64: torch.Tensor) -> torch.Tensor:
    """The scale of the true values where eager's overflowed: the largest of them, for each such position.
    An overflow upstream of a layer that mixes elements (a LayerNorm's row then a Linear) leaves each output of
    the row a value of the row's scale, one of which may be near 0: its own magnitude measures nothing."""
    overflowed = ~torch.isfinite(e64) & torch.isfinite(x)
    largest = x[overflowed].abs().max() if overflowed.any() else x.new_zeros(())
    return torch.maximum(x.abs(), largest)


def _as_near_as_eager(e: torch.Tensor, k: torch.Tensor, runs: dict, like: torch.Tensor):
    """Where kiln's value is no farther from the float64 reference's than one of eager's own answers is (its
    value, or a re-run's): eager's kernels round the true value that far off, and kiln's is one more such
    rounding (a float32 parameter's sum that nearly cancels, summed in three orders, lands on three values).
    An eager answer that is inf or NaN where the true value is finite measures nothing: it counts as 0 off."""
    reference = runs.get(FLOAT64_REFERENCE)
    if reference is None or not k.dtype.is_floating_point:
        return torch.zeros_like(like)
    x, k64 = reference.double(), k.detach().double()
    answers = [e.detach()] + [v for name, v in runs.items() if name != FLOAT64_REFERENCE]
    off = torch.stack([(v.double() - x).abs() for v in answers])
    farthest = torch.where(torch.isfinite(off), off, torch.zeros_like(off)).amax(0)
    return torch.isfinite(x) & torch.isfinite(k64) & ((k64 - x).abs() <= farthest)


def _at(t: torch.Tensor, where: list) -> str:
    return repr(t.detach()[tuple(where)].item())
