"""The wrapper: the generated Python host program that runs one compiled graph.

It takes the graph's inputs as one list, which it empties (the boxed
convention, torch's too: each input is dropped after its last use), binds the
size symbols from the inputs, allocates each kernel output with
`torch.empty_strided` (or in the storage of a dead buffer, per the memory plan; an
output written into a graph input is that input, kiln/schedule/input_writes.py),
calls the kernels and the extern ATen ops in schedule order (a view that several
of them read made once per call), drops each buffer after its last use, and
returns the graph's outputs. It is plain Python source
(written to the debug directory with trace.enabled) compiled with `exec`.
Target independent: a kernel call is `name(*pointers, *sizes)` for whatever
launcher the target binds to `name`. A kernel that checks values (an index, an
integer divisor) reports what eager would raise as an error code of
`ir.KERNEL_ERRORS` (a C++ kernel returns it; a Triton kernel stores it in the
`kiln_error` flag tensor), and the wrapper raises it right after the launch (on the GPU it asserts the
graph's one flag before returning: eager's index checks there are asynchronous device-side asserts).
"""
from __future__ import annotations

import collections
import functools
import math
import weakref

import sympy
import torch

from kiln.codegen.index_printer import pyexpr
from kiln.lower import ir
from kiln.lower.sym_floats import python_float
from kiln.schedule.fusion import ExternStep, KernelGroup, Schedule
from kiln.schedule.memory import MemoryPlan


def _restride(t: torch.Tensor, size, stride) -> torch.Tensor:
    """`t` with exactly `stride` on its non-trivial dims (copied if ATen chose another layout).

    A stride of 0 (the traced result was an expanded tensor: equal values along that dim)
    cannot be written to: one slice is copied and expanded again.
    """
    if all(n <= 1 or a == b for n, a, b in zip(size, t.stride(), stride)):
        return t
    broadcast = [d for d, (n, s) in enumerate(zip(size, stride)) if s == 0 and n > 1]
    for d in broadcast:
        t = t.narrow(d, 0, 1)
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out.expand(size) if broadcast else out


def _view(t: torch.Tensor, size, stride, offset) -> torch.Tensor:
    return t.as_strided(size, stride, t.storage_offset() + offset)


# The argument through which a Triton kernel that checks values reports an error code (an int32 tensor of
# one element, zero unless a check failed); C++ kernels return the code instead.
ERROR_FLAG = "kiln_error"


def _raise_kernel_error(code: int):
    """Raise what eager raises on the invalid value a kernel found (`code`: bits of `ir.KERNEL_ERRORS`)."""
    code = int(code)
    exception, message = ir.KERNEL_ERRORS[code & -code]
    raise exception(message)


def _check_error_flag(flag: torch.Tensor) -> None:
    """After a Triton kernel that checks values: raise its error. On the GPU the check is a device-side
    assert, as eager's own index checks are there (asynchronous: reading the flag would wait for the GPU)."""
    if flag.is_cuda:
        torch._assert_async(flag[0] == 0, "kiln: a kernel found an index out of bounds (eager raises here)")
    elif flag[0]:
        _raise_kernel_error(flag[0])


class ParameterDerived:
    """The outputs of a kernel that reads parameters alone (an inference graph's convolution weight
    copied channels-last), kept across calls and recomputed only when a parameter is replaced or
    changed in place (its version counter moves). Called with other tensors (an input that is not a
    parameter is a new tensor on every call) it computes without keeping anything.

    One graph may serve several modules of one class (the layers of a decoder share a capture entry), each
    calling it with its own parameters: the outputs are kept per set of parameter objects, so layers called in
    turn do not recompute each other's.

    A recomputation writes into the kept tensors, so they never move: a CUDA graph that read them
    stays valid as long as `refresh` runs before each replay (`kiln.runtime.cudagraphs` does)."""

    __slots__ = ("compute", "positions", "kept")

    def __init__(self, compute, positions: tuple):
        self.compute, self.positions = compute, positions  # positions: the inputs' places in the graph's inputs
        self.kept: dict[tuple[int, ...], KeptOutputs] = {}  # ids of the parameters -> what is kept for them

    def __call__(self, *sources):
        return self._current(sources) if _keeps(sources) else self.compute(*sources)

    def refresh(self, args: list) -> None:
        """Bring the kept outputs up to date with the graph inputs `args` (before a CUDA graph replay).
        Outputs of other inputs are not kept: the recording computes them itself, every replay."""
        sources = [args[i] for i in self.positions]
        if _keeps(sources):
            self._current(sources)

    def _current(self, sources):
        """The kept outputs for these parameters, recomputed first if one was changed."""
        key = [(s._version, s.data_ptr()) for s in sources]
        ids = tuple(map(id, sources))
        kept = self.kept.get(ids)
        if kept is not None and not kept.of(sources):  # an id of a parameter that is gone, reused
            kept = None
        if kept is not None and kept.key == key:
            return kept.values
        fresh = self.compute(*sources)
        if kept is not None and kept.fits(fresh):
            kept.update(key, fresh)
        else:
            for stale in [k for k, v in self.kept.items() if not v.alive()]:  # parameters replaced since
                del self.kept[stale]
            kept = self.kept[ids] = KeptOutputs(sources, key, fresh)
        return kept.values


class KeptOutputs:
    """What a `ParameterDerived` keeps for one set of parameters (held weakly: a replaced parameter's outputs
    go with it)."""

    __slots__ = ("refs", "key", "values")

    def __init__(self, sources, key: list, values):
        self.refs, self.key, self.values = [weakref.ref(s) for s in sources], key, values

    def of(self, sources) -> bool:
        return all(ref() is s for ref, s in zip(self.refs, sources))

    def alive(self) -> bool:
        return all(ref() is not None for ref in self.refs)

    def fits(self, fresh) -> bool:
        return all(o.shape == n.shape and o.stride() == n.stride() for o, n in zip(self.values, fresh))

    def update(self, key: list, fresh) -> None:
        """Write the recomputed outputs into the kept tensors, so they never move."""
        with torch.no_grad():
            for old, new in zip(self.values, fresh):
                old.copy_(new)
        self.key = key


def _keeps(sources) -> bool:
    """Are these a kept computation's inputs: parameters, with version counters (not inference tensors)?"""
    return all(type(s) is torch.nn.Parameter and not s.is_inference() for s in sources)


@functools.cache
def torch_binding(op: torch._ops.OpOverload, num_positional: int, kwarg_names: tuple) -> str | None:
    """`torch.addmm` for `aten.addmm.default`, when calling the Python binding runs exactly that overload, with
    the arguments the call leaves out given as the schema's defaults (`omitted_defaults`): a binding's own
    default may differ (`torch._C._nn.binary_cross_entropy` and the other losses default to no reduction, the
    schema to the mean, and a traced graph leaves a mean reduction out).

    The bindings (`torch.*`, `torch._C._nn.*`) parse their arguments in C++ and call the
    unboxed kernel; an `OpOverload` call goes through Python and the boxed dispatcher, which on
    small graphs is most of an extern's time (benchmarks/call_overhead.py). The binding picks
    an overload by its arguments, so it is used only when no other overload of the op
    (other than `out=` variants) could accept this call's arguments. Factory ops are left
    alone: a binding with no `device=` argument obeys `torch.set_default_device`, ATen does not.
    """
    name = op._schema.name.split("::")[1]
    if op.namespace != "aten" or any(a.name == "device" or "Device" in str(a.type) for a in op._schema.arguments):
        return None
    if getattr(torch, name, None) is getattr(torch._C._VariableFunctions, name, 0):
        text = f"torch.{name}"
    elif hasattr(torch._C._nn, name):
        text = f"torch._C._nn.{name}"
    else:
        return None
    packet = getattr(torch.ops.aten, name)
    for overload in packet.overloads():
        other = getattr(packet, overload)
        if other is op or any(a.is_out for a in other._schema.arguments):
            continue
        if _accepts(other._schema, num_positional, kwarg_names):
            return None
    spelled = omitted_defaults(op, num_positional, kwarg_names)
    return text if _accepts(op._schema, num_positional, kwarg_names) and spelled is not None else None


# default values a call can spell out: the schema's defaults the wrapper passes to a binding by name
_SPELLABLE = (type(None), bool, int, float)


@functools.cache
def omitted_defaults(op: torch._ops.OpOverload, num_positional: int, kwarg_names: tuple) -> tuple | None:
    """`name=value` for each argument of `op` with a default that a call with `num_positional` arguments and
    these keywords leaves out; None where a default is not a plain value (a call then takes the OpOverload)."""
    spelled = []
    for arg in op._schema.arguments[num_positional:]:
        if arg.name in kwarg_names or not arg.has_default_value():
            continue
        value = arg.default_value
        if not (isinstance(value, _SPELLABLE) or (isinstance(value, (list, tuple))
                                                  and all(isinstance(v, int) for v in value))):
            return None
        spelled.append(f"{arg.name}={value!r}")
    return tuple(spelled)


def _accepts(schema, num_positional: int, kwarg_names: tuple) -> bool:
    """Whether a call with `num_positional` arguments and these keywords can bind to `schema`."""
    positional = [a for a in schema.arguments if not a.kwarg_only]
    required = [a for a in positional if not a.has_default_value()]
    if not len(required) <= num_positional <= len(positional):
        return False
    names = {a.name for a in schema.arguments[num_positional:]}
    missing = [a.name for a in schema.arguments[num_positional:]
               if not a.has_default_value() and a.name not in kwarg_names]
    return set(kwarg_names) <= names and not missing


def base_namespace() -> dict:
    """The names every wrapper module runs with (the graph's constants and devices come on top): also what a
    wrapper read back from the compile cache is given again (kiln/runtime/graph_cache.py)."""
    return {"torch": torch, "math": math, "aten": torch.ops.aten, "empty_strided": torch.empty_strided,
            "_restride": _restride, "_view": _view, "device": torch.device, "_raise_kernel_error": _raise_kernel_error,
            "_check_error_flag": _check_error_flag, "ParameterDerived": ParameterDerived,
            "_increment_version": torch.autograd.graph.increment_version}


class WrapperCodegen:
    def __init__(self, sched: Schedule, plan: MemoryPlan, kernels: dict, device: str = "cpu",
                 shared_views: frozenset = frozenset()):
        self.sched, self.plan, self.kernels, self.device = sched, plan, kernels, device
        # A view of a buffer is a new tensor object per expression evaluated (as much host time as an allocation):
        # one the program reads several times (the normalized activation feeding a layer's q, k and v projections)
        # is made once per call into a local, dropped with its buffer so the memory plan's frees still free.
        self.shared_views = shared_views  # the view expressions bound to locals (`view_uses` > 1 in a first pass)
        self.view_uses: collections.Counter = collections.Counter()  # view expression -> times the program reads it
        self.view_locals: dict[str, str] = {}  # a shared view's expression -> its local, once bound
        self.views_of: dict[str, list[str]] = collections.defaultdict(list)  # buffer -> its views' locals
        self.graph = sched.graph
        self.layouts = self.graph.buffer_layouts()
        self.namespace: dict = base_namespace()
        # the device kernel outputs are allocated on, as a torch.device (a string is parsed on every call)
        self.device_name = "".join(c for c in device if c.isalnum())
        self.namespace[self.device_name] = torch.device(device)
        self.on_gpu = torch.device(device).type == "cuda"
        self.shared_flag = False  # on the GPU: the error flag of the graph's checking kernels is allocated
        self.lines: list[str] = []
        self.functions: list[str] = []  # module-level code before `call`: kept kernels' computations
        self.exact: set[str] = set()  # buffers allocated here: exactly their layout, storage offset 0
        self.input_names = {i.name for i in self.graph.inputs}

    # -- values as Python source
    def const(self, value) -> str:
        if value is None or isinstance(value, (bool, int, str)):
            return repr(value)
        if isinstance(value, float):
            return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
        if isinstance(value, (list, tuple)):
            inner = ", ".join(self.arg(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        if isinstance(value, torch.dtype):
            return str(value)
        name = f"_c{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def arg(self, a, share: bool = True) -> str:
        """`a` as Python source. `share=False` for the graph's outputs: each is a tensor of its own, as the traced
        graph's are (the runtime tells outputs apart by identity), never a view an extern read too, nor a view
        to autograd (`detach()`: the storage shared, no view of a buffer recorded). Returned as views by an
        autograd.Function with several outputs, they could not be written in place (the 4-d output of a batched
        matmul, a view of its 3-d buffer, written after a graph break), where eager's are not views."""
        if isinstance(a, ir.TensorRef):
            if not a.view:
                return a.buf
            lay = a.layout
            if lay.offset == 0:  # as_strided keeps the base's storage offset
                view = f"{a.buf}.as_strided({self.shape(lay.size)}, {self.shape(lay.stride)})"
            else:
                view = f"_view({a.buf}, {self.shape(lay.size)}, {self.shape(lay.stride)}, {pyexpr(lay.offset)})"
            return self.shared_view(a.buf, view) if share else f"{view}.detach()"
        if isinstance(a, ir.SymRef):
            return pyexpr(a.expr)
        if isinstance(a, ir.SizeFloatRef):
            return python_float(a.value, pyexpr)
        return self.const(a)

    def shared_view(self, buf: str, view: str) -> str:
        """`view` as the program reads it: the expression, or for a view read more than once its local (bound on
        the line before its first reader)."""
        self.view_uses[view] += 1
        if view not in self.shared_views:
            return view
        name = self.view_locals.get(view)
        if name is None:
            name = self.view_locals[view] = f"_v{len(self.view_locals)}"
            self.views_of[buf].append(name)
            self.line(f"{name} = {view}")
        return name

    def released(self, bufs) -> str:
        """The names to `del` when `bufs` die: they and the locals of their shared views."""
        return ", ".join(n for b in bufs for n in (b, *self.views_of.pop(b, ())))

    def shape(self, xs) -> str:
        inner = ", ".join(pyexpr(x) for x in xs)
        return f"({inner}{',' if len(xs) == 1 else ''})"

    def op_name(self, op, num_positional: int = 0, kwarg_names: tuple = ()) -> str:
        if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten":
            return torch_binding(op, num_positional, kwarg_names) or \
                f"aten.{op._schema.name.split('::')[1]}.{op._overloadname}"
        return self.const(op)

    @staticmethod
    def binding_defaults(op, num_positional: int, kwarg_names: tuple) -> tuple:
        """The defaults a call through a binding spells out (`torch_binding`); none for an OpOverload call."""
        if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten" and torch_binding(
                op, num_positional, kwarg_names):
            return omitted_defaults(op, num_positional, kwarg_names)
        return ()

    # -- the program
    def generate(self) -> str:
        g = self.graph
        names = [i.name for i in g.inputs]
        self.line = lambda s: self.lines.append("    " + s)
        # Boxed: the caller's list is emptied, so that an input dropped after its last use (the memory plan)
        # is freed there, unless the caller holds it elsewhere (a parameter).
        self.lines.append("def call(args):")
        if names:
            self.line("".join(n + ", " for n in names) + "= args")
        self.line("args.clear()")
        for sym, source in g.size_vars.items():
            self.line(f"{sym} = {source}")
        unread = self.plan.release_after.get(-1)
        if unread:  # after the sizes are read from them
            self.line("del " + ", ".join(unread))
        kernel_reads, kernel_writes = set(), set()
        for k in self.kernels.values():
            kernel_reads |= set(k.arg_names)
            kernel_writes |= set(k.outputs)
        written = [i.name for i in g.inputs if i.name in kernel_writes]
        if written:  # as eager's in-place ops do, before the first write: a call that raises after it shows it
            self.line(f"_increment_version(({''.join(w + ', ' for w in written)}))")
        for inp in g.inputs:
            if isinstance(inp, ir.InputBuffer) and inp.name in kernel_reads:
                self.restride(inp.name, inp.name, inp.layout)
        for name in g.constants:
            self.namespace[name] = g.constants[name]
        kept = set(self.plan.kept)
        for k, step in enumerate(self.sched.steps):
            if isinstance(step, KernelGroup) and step.name in kept:
                self.kept_kernel_call(step, names)
            elif isinstance(step, KernelGroup):
                self.kernel_call(step)
            else:
                self.extern_call(step)
            dead = self.plan.release_after.get(k, [])
            if dead:
                self.line("del " + self.released(dead))
        if self.shared_flag:
            self.line(f"_check_error_flag({ERROR_FLAG})")
        self.line("return (" + "".join(self.arg(o, share=False) + ", " for o in g.outputs) + ")")
        return "\n".join(self.functions + self.lines) + "\n"

    def restride(self, dst: str, src: str, layout: ir.Layout) -> None:
        """Make `src` have `layout`'s strides (a cheap tuple compare per call; a copy only if ATen differed).

        A dim of one element may have any stride (ATen's and the traced one often differ there: a batch of
        one), so only the other dims are compared; a tensor of one element needs no check at all."""
        stride = self.shape(layout.stride)
        fix = f"{dst} = _restride({src}, {self.shape(layout.size)}, {stride})"
        static = all(sympy.sympify(n).is_Integer for n in layout.size)
        dims = [d for d, n in enumerate(layout.size) if not (static and int(n) == 1)]
        if len(dims) == len(layout.size):
            self.line(f"if {src}.stride() != {stride}: {fix}")
        elif dims:
            picked = "".join(f"_s[{d}], " for d in dims)
            wanted = "".join(f"{pyexpr(layout.stride[d])}, " for d in dims)
            self.line(f"_s = {src}.stride()")
            self.line(f"if ({picked}) != ({wanted}): {fix}")

    def kernel_call(self, group: KernelGroup, own_flag: bool = False) -> None:
        """Allocate `group`'s outputs and launch it. A Triton kernel that checks values reports into the error
        flag, checked right after the launch under the interpreter, as eager raises at the op. On the GPU eager's
        index checks are device-side asserts, reported at a later synchronization: there all the graph's
        kernels share one flag, asserted once before the wrapper returns (one assert, not an allocation and two
        kernels more per checking kernel: T5's 15 gathers a step). `own_flag`: a kept kernel's function checks
        its own."""
        kernel = self.kernels[group.name]
        for b in kernel.outputs:
            if b in self.input_names:  # the kernel writes into the input (kiln/schedule/input_writes.py)
                continue
            lay = self.layouts[b]
            old = self.plan.reuse.get(b)
            if old is not None and old in self.exact and self._same_layout(self.layouts[old], lay):
                self.line(f"{b} = {old}; del {self.released([old])}  # reuse")
            elif old is not None:
                view = f"{old}.as_strided({self.shape(lay.size)}, {self.shape(lay.stride)})"
                self.line(f"{b} = {view}; del {self.released([old])}  # reuse")
            else:
                self.line(f"{b} = empty_strided({self.shape(lay.size)}, {self.shape(lay.stride)}, "
                          f"dtype={lay.dtype}, device={self.device_name})")
            if old is None or old in self.exact:
                self.exact.add(b)
        # C++ kernels take raw pointers; Triton launchers take the tensors (`takes_tensors`)
        ptr = "{}" if getattr(kernel, "takes_tensors", False) else "{}.data_ptr()"
        args = [ptr.format(b) for b in kernel.arg_names] + [pyexpr(s) for s in kernel.size_args]
        launch = f"{group.name}({', '.join(args)})"
        if ERROR_FLAG in kernel.arg_names:
            checked_here = own_flag or not self.on_gpu  # else into the graph's one flag, asserted before the return
            if checked_here or not self.shared_flag:
                self.line(f"{ERROR_FLAG} = torch.zeros(1, dtype=torch.int32, device={self.device_name})")
            self.shared_flag = self.shared_flag or not checked_here
            self.line(launch)
            if checked_here:
                self.line(f"_check_error_flag({ERROR_FLAG})")
        elif getattr(kernel, "reports_errors", False):
            self.line(f"_error = {launch}")
            self.line("if _error: _raise_kernel_error(_error)")
        else:
            self.line(launch)

    def kept_kernel_call(self, group: KernelGroup, inputs: list[str]) -> None:
        """A kernel that reads graph inputs alone (`MemoryPlan.kept`): its allocations and launch become a
        function of those inputs, called through a `ParameterDerived` that keeps the results."""
        kernel = self.kernels[group.name]
        sources = [a for a in kernel.arg_names if a in inputs]
        body: list[str] = []
        call_line, self.line = self.line, lambda s: body.append("    " + s)
        self.kernel_call(group, own_flag=True)
        self.line = call_line
        outputs = "".join(b + ", " for b in kernel.outputs)
        positions = self.shape([inputs.index(a) for a in sources])
        self.functions += [f"def _compute_{group.name}({', '.join(sources)}):", *body, f"    return ({outputs})", "",
                           f"_kept_{group.name} = ParameterDerived(_compute_{group.name}, {positions})", "", ""]
        self.line(f"{outputs}= _kept_{group.name}({', '.join(sources)})  # recomputed when a parameter changes")

    @staticmethod
    def _same_layout(a: ir.Layout, b: ir.Layout) -> bool:
        return (a.dtype == b.dtype and a.offset == 0 and b.offset == 0 and tuple(a.size) == tuple(b.size)
                and tuple(a.stride) == tuple(b.stride))

    def extern_call(self, step: ExternStep) -> None:
        n = step.node
        if isinstance(n, ir.MultiOutput):
            self.line(f"{n.name} = {n.source}[{n.index}]")
            self.restride(n.name, n.name, n.layout)
            return
        args = [self.arg(a) for a in n.args] + [f"{k}={self.arg(v)}" for k, v in n.kwargs.items()]
        args += self.binding_defaults(n.op, len(n.args), tuple(n.kwargs))
        self.line(f"{n.name} = {self.op_name(n.op, len(n.args), tuple(n.kwargs))}({', '.join(args)})")
        if isinstance(n.layout, ir.Layout):
            self.restride(n.name, n.name, n.layout)


def generate_wrapper(sched: Schedule, plan: MemoryPlan, kernels: dict, device: str = "cpu") -> tuple[str, dict]:
    """(source of `call`, the namespace it runs in, minus the kernel launchers). Written twice where the first
    program reads a view more than once: the second binds each such view once (`WrapperCodegen.shared_view`)."""
    w = WrapperCodegen(sched, plan, kernels, device)
    source = w.generate()
    shared = frozenset(v for v, n in w.view_uses.items() if n > 1)
    if shared:
        w = WrapperCodegen(sched, plan, kernels, device, shared)
        source = w.generate()
    return source, w.namespace
