"""Building the captured FX graph, with fake tensors flowing through every op.

Each op the interpreter records runs once on fake tensors (shape, dtype, device
and requires_grad, no data), which is how capture knows the result's metadata
and whether the op is legal, and becomes one node of a `torch.fx.Graph` of
torch-level calls — the graph every backend receives.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._dispatch.python import enable_python_dispatcher
from torch._guards import Source as TorchSource
from torch._library.custom_ops import CustomOpDef
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
from torch.fx.graph import _is_from_torch
from torch.fx.node import _get_qualified_name

from kiln.capture.breaks import GraphBreak, breaks_inference_rule, inference_tensor_misuse
from kiln.capture.fake_reuse import FakeResults
from kiln.capture.sources import Source


def symbolic_dims(fake: torch.Tensor, asked: frozenset) -> frozenset:
    """Those of the dims `asked` dynamic that `fake` has symbolic sizes at: the fake mode keeps one fake per tensor,
    so a tensor made a fake before, static (as the base of a view of it read first), stays static."""
    return frozenset(d for d in asked if isinstance(fake.shape[d], torch.SymInt))


class GraphBuilder:
    """One graph under construction: its placeholders (by source) and its nodes."""

    def __init__(self) -> None:
        self.graph = fx.Graph()
        # Symbolic sizes of dynamic dimensions, and the guards on them. Ops whose output size or value
        # depends on tensor data (nonzero, x[mask], unique, .item()) raise on fake tensors instead of
        # inventing unbacked sizes: such an op ends the graph and runs natively, as torch.compile does
        # by default (capture_dynamic_output_shape_ops / capture_scalar_outputs off). An unbacked size
        # printed into generated code would name a symbol nothing binds.
        self.shape_env = ShapeEnv(allow_scalar_outputs=False, allow_dynamic_output_shape_ops=False)
        self.fake_mode = WatchingFakeMode(allow_non_fake_inputs=False, shape_env=self.shape_env)
        self.fake_results = FakeResults(self.fake_mode)  # repeated calls' results, made without running them
        # sympy symbol -> (source, dim) of the input size it stands for; dim None: an int input itself
        self.symbol_sources: dict = {}
        self.inputs: list[tuple[Source, torch.Tensor | int]] = []  # placeholder order: tensors and int inputs
        # per input: does its tensor guard leave sizes unchecked (dynamic dims), for the shape guard to check
        self.input_is_dynamic: list[bool] = []
        self._input_nodes: dict[Source, tuple[fx.Node, torch.Tensor]] = {}  # source -> placeholder, traced fake
        # id(real) -> its placeholder and fake (`inputs` keeps each real tensor alive, so ids stay unique)
        self._input_of_tensor: dict[int, tuple[fx.Node, torch.Tensor]] = {}
        self._names: set[str] = set()
        self.op_count = 0
        self.enables_grad = False  # a grad-mode change inside the graph turns it on
        # Inside a traced `torch.inference_mode()` block (set by the capture state): fake ops run in real
        # inference mode, so the tensors they make are inference tensors as eager's are, and a use eager
        # forbids outside the block (an in-place write, saving one for backward) raises here as it does there.
        self.inference_mode = False

    # --- inputs -----------------------------------------------------------------------------
    def input(self, source: Source, real: torch.Tensor, dynamic_dims: frozenset = frozenset()):
        """The placeholder for the tensor at `source` (one per tensor: the capture guards that a second
        source of it is the same object), and its fake value.

        Dimensions in `dynamic_dims` get symbolic sizes (equal sizes share a symbol: duck
        sizing); sizes 0 and 1 stay static, as torch does.
        """
        if source in self._input_nodes:
            return self._input_nodes[source]
        if id(real) in self._input_of_tensor:  # one tensor reached through two sources: one placeholder, as a
            # write or an in-place view op (`a.t_()` in `f(x, x)`) through either source shows through both
            self._input_nodes[source] = self._input_of_tensor[id(real)]
            return self._input_nodes[source]
        name = self._unique(_identifier(source.name()))
        node = self._insert_placeholder(name)
        fake = self._fake(real, source, dynamic_dims)
        node.meta["example_value"] = node.meta["val"] = self._as_passed(fake)
        node.meta["source"] = source.expr()
        self._input_nodes[source] = self._input_of_tensor[id(real)] = node, fake
        self.inputs.append((source, real))
        self.input_is_dynamic.append(bool(symbolic_dims(fake, dynamic_dims)))
        return node, fake

    def int_input(self, source: Source, value: int) -> tuple[fx.Node, torch.SymInt]:
        """The placeholder for the int at `source` as a symbol of its own (automatic dynamic for ints), and its
        SymInt.

        The symbol is unspecified, as torch makes an int input: neither assumed positive nor specialized at 0
        and 1, and never shared with an equal size (no duck sizing). The guards on it are only the relations
        the graph needed (a bound an index must keep within, a divisibility a reshape relied on).
        """
        if source in self._input_nodes:
            return self._input_nodes[source]
        node = self._insert_placeholder(self._unique(_identifier(source.name())))
        sym = self.shape_env.create_unspecified_symint_and_symbol(value, _ShapeEnvSource(source.expr()),
                                                                   DimDynamic.DYNAMIC)
        node.meta["example_value"] = node.meta["val"] = sym
        node.meta["source"] = source.expr()
        self._input_nodes[source] = node, sym
        self.inputs.append((source, value))
        self.input_is_dynamic.append(True)
        self.symbol_sources.setdefault(sym.node.expr, (source, None))
        return node, sym

    def _as_passed(self, fake: torch.Tensor) -> torch.Tensor:
        """A fake that keeps the input's metadata as it was passed, for the placeholder's meta.

        The trace runs on `fake` itself, and an in-place view op (t_, unsqueeze_, transpose_,
        as_strided_, resize_) changes its sizes and strides. The shape guards and the AOT stage
        read the placeholders' meta as the input at call time: they get this detached alias (same
        storage, own metadata) instead, which no traced op touches.
        """
        with self.fake_mode:
            passed = fake.detach()
        return passed.requires_grad_(fake.requires_grad)

    def _fake(self, real: torch.Tensor, source: Source, dynamic_dims: frozenset) -> torch.Tensor:
        if not dynamic_dims:
            return self.fake_mode.from_tensor(real, static_shapes=True)
        sizes = [DimDynamic.DUCK if d in dynamic_dims else DimDynamic.STATIC for d in range(real.dim())]
        fake = self.fake_mode.from_tensor(real, symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes))
        for d, size in enumerate(fake.shape):
            if isinstance(size, torch.SymInt) and size.node.expr.is_symbol:
                self.symbol_sources.setdefault(size.node.expr, (source, d))
        return fake

    @property
    def rng_devices(self) -> frozenset:
        """The devices ('cpu', or a CUDA device's index) whose generator an op of the graph draws from."""
        return frozenset(self.fake_mode.rng_devices)

    @property
    def uses_private_generator(self) -> bool:
        """Whether a random op draws from a `generator=` of the user's rather than the default one."""
        return self.fake_mode.uses_private_generator

    @property
    def checks_values(self) -> bool:
        """Whether an op of the graph may raise on the values it reads (an index out of range, an integer
        division by zero), where capture saw it succeed on shapes alone."""
        return self.fake_mode.checks_values

    @property
    def enters_autocast(self) -> bool:
        """Whether the graph enters a `torch.autocast` block (which a raise inside it leaves on)."""
        return any(n.target is torch.amp.autocast_mode._enter_autocast for n in self.graph.nodes)

    def written_inputs(self) -> list[bool]:
        """Per input (placeholder order), whether the graph writes it. Capture's fake inputs start at
        version 0, so a write shows as a later version; an inference tensor keeps no version: it may
        have been written."""
        return [isinstance(real, torch.Tensor) and _written(self._input_nodes[source][1])
                for source, real in self.inputs]

    def view_bases(self) -> list[torch.Tensor]:
        """The fake bases of the inputs that are views. The fake-tensor converter gives a view's base
        symbolic sizes of its own, which no input is the source of (unless the base is an input too):
        the relations over them are the bounds every real view keeps within its base."""
        return [fake._base for _, fake in self._input_nodes.values()
                if isinstance(fake, torch.Tensor) and fake._base is not None]

    def is_dynamic(self) -> bool:
        return bool(self.symbol_sources)

    def _insert_placeholder(self, name: str) -> fx.Node:
        """A new placeholder after the others, which this method alone inserts and so keeps at the graph's start:
        found from the start, not by a walk over every op (an input is lifted when first read, mid-graph)."""
        last = None
        for node in self.graph.nodes:
            if node.op != "placeholder":
                break
            last = node
        if last is not None:
            with self.graph.inserting_after(last):
                return self.graph.placeholder(name)
        with self.graph.inserting_before(next(iter(self.graph.nodes), None)):
            return self.graph.placeholder(name)

    def _unique(self, name: str) -> str:
        base, n = name, 1
        while name in self._names:
            name, n = f"{base}_{n}", n + 1
        self._names.add(name)
        return name

    # --- ops ----------------------------------------------------------------------------------
    def call(self, kind: str, target: Any, args: tuple, kwargs: dict, fake_args: tuple, fake_kwargs: dict):
        """Record `target(*args, **kwargs)`; returns (node, fake result). Args are nodes/constants."""
        fake_out = self._run_fake(kind, target, fake_args, fake_kwargs)
        node = self.graph.create_node(kind, printable_target(target) if kind == "call_function" else target, args,
                                      kwargs)
        node.meta["example_value"] = fake_out
        self.op_count += 1
        return node, fake_out

    def _run_fake(self, kind: str, target: Any, args: tuple, kwargs: dict) -> Any:
        """The call's fake result: run on the fake tensors, or made anew from an earlier identical call's
        (kiln/capture/fake_reuse.py; not with symbolic sizes, whose ops may add guards)."""
        # not `inference_mode(False)` outside a block: that turns grad mode on
        with torch.inference_mode() if self.inference_mode else contextlib.nullcontext():
            described = None if self.symbol_sources else self.fake_results.describe(kind, target, args, kwargs)
            if described is not None:
                reused = self.fake_results.reuse(described)
                if reused is not None:
                    return reused
                return self.fake_results.run(described, lambda: self._fake_call(kind, target, args, kwargs), args,
                                             kwargs)
            return self._fake_call(kind, target, args, kwargs)

    def _fake_call(self, kind: str, target: Any, args: tuple, kwargs: dict) -> Any:
        fn: Callable = getattr(args[0], target) if kind == "call_method" else target
        call_args = args[1:] if kind == "call_method" else args
        try:
            # With symbolic sizes, composite ops (F.pad, ...) must decompose in Python, where sizes
            # stay symbols; their C++ versions would specialize every size they read.
            with self.fake_mode, (enable_python_dispatcher() if self.symbol_sources else contextlib.nullcontext()):
                return fn(*call_args, **kwargs)
        except DynamicOutputShapeException as e:  # nonzero, x[mask], unique, ...
            raise GraphBreak("dynamic_output_shape", f"{_name(target)} ({type(e).__name__})") from e
        except DataDependentOutputException as e:  # torch.equal, torch.allclose: a Python value from data
            raise GraphBreak("tensor_to_python", f"{_name(target)} ({type(e).__name__})") from e
        except GraphBreak:
            raise
        except RuntimeError as e:
            if not self.inference_mode and breaks_inference_rule(e):
                raise inference_tensor_misuse(_name(target), e) from e
            raise GraphBreak("exception", f"{_name(target)} raised {type(e).__name__}: {e}") from e
        except Exception as e:
            raise GraphBreak("exception", f"{_name(target)} raised {type(e).__name__}: {e}") from e

    def getitem(self, node: fx.Node, index: int, fake: Any) -> fx.Node:
        out = self.graph.call_function(operator.getitem, (node, index))
        out.meta["example_value"] = fake
        return out

    def set_grad_enabled(self, enabled: bool) -> None:
        """Grad mode changes inside the graph are nodes, so the backend sees them in order."""
        self.graph.call_function(torch._C._set_grad_enabled, (enabled,))
        self.enables_grad = self.enables_grad or enabled

    def start_with_grad_disabled(self) -> None:
        """Make the graph's first op turn grad mode off: the output program then calls it with grad
        mode on (see `write_program`), so the backend knows a part of it records gradients."""
        ops = [n for n in self.graph.nodes if n.op != "placeholder"]
        if ops:
            with self.graph.inserting_before(ops[0]):
                self.graph.call_function(torch._C._set_grad_enabled, (False,))

    def output(self, nodes: list[fx.Node]) -> fx.GraphModule:
        # No dead-code elimination: an unused random op still advances the RNG in eager.
        self.graph.output(tuple(nodes))
        gm = fx.GraphModule(torch.nn.Module(), self.graph, class_name="CapturedGraph")
        return gm


class _SymbolName(str):
    """A source's name as torch's shape environment reads it: an attribute (`source.name`) on newer torch, a
    method (`source.name()`) on older."""

    def __call__(self) -> str:
        return str(self)


class _ShapeEnvSource(TorchSource):
    """What the shape environment records as the origin of an int input's symbol (its logs and debug names).
    The guards over the symbol are written from kiln's own sources (`entry._add_shape_guard`)."""

    def __init__(self, expr: str):
        self.__dict__["name"] = _SymbolName(expr)

    @property
    def _name_template(self) -> str:
        return str(self.name)

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other) -> bool:
        return isinstance(other, _ShapeEnvSource) and other.name == self.name


class WatchingFakeMode(FakeTensorMode):
    """The fake mode capture runs ops in, noting which ATen ops it sees that matter when the graph raises.

    A graph that raised may be re-run eagerly from the frame's start (see `kiln.capture.rerun`):
    - the re-run must draw the same random numbers as eager, so the generator's state is saved before
      a graph drawing them runs. ATen tags every op that consumes the generator `nondeterministic_seeded`;
      composite ops (dropout) reach this mode as their parts;
    - the re-run must see the inputs as they were, so the inputs a graph writes are copied before it
      runs when an op of it checks values (`VALUE_CHECKED_OPS`): only such a graph raises at run time.
    """

    uses_private_generator = False
    checks_values = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rng_devices: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if torch.Tag.nondeterministic_seeded in func.tags:
            if kwargs and kwargs.get("generator") is not None:
                self.uses_private_generator = True
            # a random op draws from the generator of the device its result is on
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.rng_devices.add(_generator_of(t.device))
        if not self.checks_values and (_checks_values(func, out) or _doomed(func, args, kwargs or {})):
            self.checks_values = True
        return out


_aten = torch.ops.aten
DEVICE_ASSERTED_ON_CUDA = frozenset((
    # indices read from a tensor, checked against the indexed size
    _aten.index, _aten.index_put, _aten.index_put_, _aten._index_put_impl, _aten._index_put_impl_, _aten.gather,
    _aten.scatter, _aten.scatter_, _aten.scatter_add, _aten.scatter_add_, _aten.scatter_reduce, _aten.scatter_reduce_,
    _aten.index_select, _aten.index_add, _aten.index_add_, _aten.index_copy, _aten.index_copy_, _aten.index_fill,
    _aten.index_fill_, _aten.index_reduce, _aten.index_reduce_, _aten.embedding, _aten._embedding_bag,
    _aten.embedding_bag, _aten.take, _aten.put, _aten.put_,
    # class targets checked against the number of classes
    _aten.nll_loss_forward, _aten.nll_loss2d_forward,
    # asserts on values
    _aten._assert_async,
))
"""Value-checked ops whose CUDA kernels check with a device-side assert: no exception at the op, and a CUDA
context no later call (a re-run included) survives. kiln's own CUDA kernels check indices so too."""

VALUE_CHECKED_OPS = DEVICE_ASSERTED_ON_CUDA | frozenset((
    _aten.masked_scatter, _aten.masked_scatter_, _aten.max_unpool2d, _aten.max_unpool3d,
    _aten.multi_margin_loss, _aten.multilabel_margin_loss_forward, _aten._ctc_loss,
    # probabilities checked to lie in [0, 1]; factorizations checked for singular or non-definite inputs
    _aten.multinomial, _aten.bernoulli, _aten.bernoulli_, _aten.binary_cross_entropy, _aten._linalg_check_errors,
    _aten._assert_scalar,
))
"""ATen ops whose kernels check the values they read and raise (fake tensors run no such check)."""

_INTEGER_DIVISIONS = frozenset((_aten.div, _aten.div_, _aten.floor_divide, _aten.floor_divide_, _aten.remainder,
                                _aten.remainder_, _aten.fmod, _aten.fmod_))
"""Divisions that raise ZeroDivisionError on a zero divisor, when their result is an integer."""


def _checks_values(func, out) -> bool:
    """Whether `func` may raise at run time on the values it reads, with `out` its (fake) result: on the GPU an
    index or class check (`DEVICE_ASSERTED_ON_CUDA`) and an integer division (no check: eager's CUDA kernel
    divides by zero without raising) raise nothing that a re-run could follow, so a CUDA graph with only those
    takes no copy of the inputs it writes (a CNN's batch counters, every training step, for its loss's class
    check)."""
    packet = getattr(func, "overloadpacket", None)
    if packet in VALUE_CHECKED_OPS:
        return not (packet in DEVICE_ASSERTED_ON_CUDA and _on_cuda(out))
    return packet in _INTEGER_DIVISIONS and isinstance(out, torch.Tensor) and not (
        out.is_floating_point() or out.is_complex() or out.is_cuda)


_BOOL_REFUSING = frozenset((_aten.sub, _aten.sub_, _aten.rsub, _aten.neg, _aten.neg_))
_CASTING_WRITES = frozenset((_aten.copy_, _aten.fill_))  # they cast what they write, to any dtype
_WITHOUT_IDENTITY = frozenset((_aten.max, _aten.min, _aten.amax, _aten.amin, _aten.argmax, _aten.argmin,
                               _aten.aminmax))


def _doomed(func, args: tuple, kwargs: dict) -> bool:
    """Whether eager raises at `func` by its operands' types or layout, which fake tensors do not check (the graph
    then runs op by op to raise: kiln/autograd/eager_errors.py): a subtraction or negation of a bool, an in-place
    result its tensor's dtype cannot hold (not a copy or fill, which cast), a write into a tensor whose elements
    share memory (an expanded one), a reduction without identity over no element. Like a value check, such a
    graph may raise after writing its inputs, so they are copied before it runs."""
    packet = getattr(func, "overloadpacket", None)
    operands = [*args, *kwargs.values()]
    if packet in _BOOL_REFUSING:
        return any(isinstance(a, bool) or (isinstance(a, torch.Tensor) and a.dtype == torch.bool) for a in operands)
    if packet in _WITHOUT_IDENTITY:
        return bool(args) and isinstance(args[0], torch.Tensor) and args[0].numel() == 0
    if not (args and isinstance(args[0], torch.Tensor) and _writes_first_argument(func)):
        return False
    target = args[0]
    if any(stride == 0 and size > 1 for size, stride in zip(target.shape, target.stride())):
        return True
    if packet in _CASTING_WRITES:
        return False
    numbers = [a for a in operands[1:] if isinstance(a, (torch.Tensor, int, float, complex, bool))]
    try:
        result = torch.result_type(target, numbers[0]) if len(numbers) == 1 else target.dtype
    except (RuntimeError, TypeError):
        return False
    return not torch.can_cast(result, target.dtype)


@functools.cache
def _writes_first_argument(func) -> bool:
    """Whether `func`'s schema writes its first (positional) argument: an in-place op (per op, once: capture asks
    at every op it runs)."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.arguments:
        return False
    first = schema.arguments[0]
    return first.alias_info is not None and first.alias_info.is_write and not first.kwarg_only


def _on_cuda(out) -> bool:
    tensors = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(t.is_cuda for t in tensors)


def _generator_of(device: torch.device):
    """'cpu', or the index of the CUDA device (whose default generator a random op on it draws from)."""
    if device.type != "cuda":
        return "cpu"
    return device.index if device.index is not None else torch.cuda.current_device()


def _written(fake: torch.Tensor) -> bool:
    try:
        return fake._version > 0
    except RuntimeError:
        return True


_PRINTABLE: dict[int, tuple[Any, Any]] = {}  # id(target) -> (target, what the graph calls)


def printable_target(target: Any) -> Any:
    """What the graph's node calls for `target`: `target`, unless the graph's printed code would name
    another object. FX prints a function of a `torch*` module by its qualified name and resolves that
    name when the code runs. The `_VF` builtins that `torch.functional` wraps (`broadcast_tensors`,
    `split`, `stft`, `norm`, ...) print as `torch.<name>`, which is the Python wrapper taking other
    arguments; a function defined in `torch.testing` under a name its module does not bind (a lambda
    assigned to an attribute) prints as a name that does not exist. Such a target becomes a plain
    function calling it, which FX binds by object. A custom op's definition (what `torch.library.custom_op`
    returns) is called as its operator, which is all its `__call__` does: the graph then names the op
    (`torch.ops.<namespace>.<name>.default`), as the later stages and the compile cache know ops."""
    if isinstance(target, CustomOpDef):
        return target._opoverload
    cached = _PRINTABLE.get(id(target))
    if cached is not None and cached[0] is target:
        return cached[1]
    printed = target if _resolves(target) else _calling(target)
    _PRINTABLE[id(target)] = (target, printed)
    return printed


def _resolves(target: Any) -> bool:
    """Whether the name FX prints for `target` names `target` itself."""
    if not _is_from_torch(target):
        return True  # FX binds it by object
    try:
        parts = _get_qualified_name(target).split(".")
    except Exception:
        return False
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr, None)
        return obj is target
    return False


def _calling(target: Callable) -> Callable:
    def call(*args, **kwargs):
        return target(*args, **kwargs)

    call.__name__ = call.__qualname__ = _identifier(getattr(target, "__name__", "call"))
    return call


def _name(target: Any) -> str:
    return getattr(target, "__name__", str(target))


def _identifier(name: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name).strip("_").lower() or "input"
    return out if not out[0].isdigit() else "_" + out

