"""Tensors during capture: an FX node plus a fake tensor carrying its metadata.

Every torch function, tensor method and operator on a tensor becomes a graph
node through `trace_op`; metadata queries (`.shape`, `.dtype`, `.dim()`) are
answered from the fake tensor as constants — the tensor guard on the inputs
is what makes that safe. Reading a tensor's data into Python (`.item()`,
`if t:`) is a graph break.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from kiln.capture import value_bounds
from kiln.capture.breaks import GraphBreak, breaks_inference_rule, inference_tensor_misuse
from kiln.capture.sources import AttrSource
from kiln.capture.values.base import Value
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.containers import ListValue, SizeValue, SliceValue, TupleValue
from kiln.capture.values.exceptions import raise_python
from kiln.capture.values.returned_inputs import returned_input
from kiln.capture.values.symbolic import SYM_TYPES, SymValue, is_symbolic

# Tensor methods that read data into Python: the graph ends there.
DATA_READS = {
    "item": "tensor_to_python",
    "tolist": "tensor_to_python",
    "numpy": "numpy",
    "data_ptr": "tensor_to_python",
    "__bool__": "data_dependent_branch",
    "__int__": "tensor_to_python",
    "__float__": "tensor_to_python",
    "__index__": "tensor_to_python",
    "backward": "autograd_backward",
    "register_hook": "unsupported_call",
    "untyped_storage": "unsupported_call",
}

# In-place changes of a tensor's autograd flags: no ATen op, so no compiled graph can make them.
AUTOGRAD_FLAG_METHODS = {"requires_grad_", "detach_"}

# Metadata methods answered from the fake tensor.
METADATA_METHODS = {"size", "dim", "ndimension", "numel", "nelement", "stride", "is_contiguous", "element_size",
                    "is_floating_point", "is_complex", "get_device", "storage_offset", "type", "__len__"}
METADATA_ATTRS = {"shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_leaf", "layout", "is_sparse",
                  "is_quantized", "is_meta", "itemsize", "is_mkldnn", "is_nested"}


class TensorValue(Value):
    real: torch.Tensor | None = None  # the input tensor itself, for identity (`p in memo`, tied weights)
    # what the capture knows of the values without reading them (kiln/capture/value_bounds.py): the closed range of
    # every element, and the truth of a one-element comparison that range decides
    bounds: tuple[float, float] | None = None
    known_truth: bool | None = None

    def __init__(self, node: fx.Node, fake: torch.Tensor, source=None):
        self.node, self.fake, self.source = node, fake, source

    def python_type(self) -> type:
        if self.real is not None:
            return type(self.real)  # the tensor guard checks this exact type
        if self.source is not None and isinstance(self.fake, torch.nn.Parameter):
            return torch.nn.Parameter
        return torch.Tensor

    def getattr(self, state, name: str) -> Value:
        if name == "shape":
            return self.size_value(state)
        if name in METADATA_ATTRS:
            return ConstantValue(getattr(self.fake, name))
        if name in ("T", "mT", "H", "mH", "real", "imag", "data"):
            # `.data` is not `detach()`: it shares the storage with a version counter of its own, so that a write
            # through it is one the autograd of `self` does not see (traced at the ATen level, it is a `detach`
            # whose result counts versions apart)
            return trace_op(state, "call_function", getattr, [self, ConstantValue(name)], {})
        if name == "grad":
            if self.source is None:
                raise GraphBreak("unsupported_object", "reading .grad of a tensor made inside the graph")
            if state.grads_reset:
                raise GraphBreak("unsupported_object", "reading .grad after optimizer.zero_grad() in the same "
                                 "graph (the reset runs after the graph)")

            return state.wrap(state.real_value(self.source).grad, AttrSource(self.source, "grad"))
        if hasattr(torch.Tensor, name) and callable(getattr(torch.Tensor, name)):
            return TensorMethodValue(self, name)
        if name == "_version":  # read natively below, from the graph's tensor, which counts versions
            self.raise_if_inference_misuse(state, "Tensor._version", lambda fake: fake._version)
        if not hasattr(torch.Tensor, name) and (self.source is None
                                                or not hasattr(state.real_value(self.source), name)):
            # hasattr(t, "jax") and getattr(t, name, default) rely on the AttributeError

            raise raise_python(AttributeError, f"'Tensor' object has no attribute {name!r}")
        raise GraphBreak("unsupported_object", f"tensor attribute {name!r}")

    def call_method(self, state, name: str, args: list[Value], kwargs: dict[str, Value]) -> Value:
        if name == "item" and not args and not kwargs and state.captures_scalars:
            return item_of(state, self)
        if name in DATA_READS:
            raise GraphBreak(DATA_READS[name], f"Tensor.{name}()")
        if name == "size" and not args and not kwargs:
            return self.size_value(state)
        if name in AUTOGRAD_FLAG_METHODS:
            return self.set_autograd_flags(state, name, args, kwargs)
        if name in METADATA_METHODS and not (name == "type" and (args or kwargs)):  # t.type(dtype) converts
            const_args = [a.as_constant() for a in args]
            const_kwargs = {k: v.as_constant() for k, v in kwargs.items()}
            result = getattr(self.fake, name)(*const_args, **const_kwargs)
            if _has_symbols(result):
                return trace_op(state, "call_method", name, [self, *args], kwargs)
            return ConstantValue(result)
        return trace_op(state, "call_method", name, [self, *args], kwargs)

    def set_autograd_flags(self, state, name: str, args: list[Value], kwargs: dict[str, Value]) -> Value:
        """`t.requires_grad_(flag)` or `t.detach_()`: the tensor itself where its flags stay as they are, as
        eager returns it; a graph break where they change (or eager raises: `detach_` of a view).

        A graph's autograd node cannot give an input, or a tensor it returns, other flags than the
        compiled graph's own: kiln would return the input still requiring grad after `x.detach_()`.
        torch.compile breaks the graph on such a `requires_grad_` as well."""
        if name == "requires_grad_":
            flag = (args or [kwargs.get("requires_grad", ConstantValue(True))])[0]
            unchanged = flag.is_constant() and bool(flag.as_constant()) == self.fake.requires_grad
        else:
            unchanged = not self.fake.requires_grad and not self.fake._is_view()
        if unchanged:
            return self
        if name == "requires_grad_":  # run natively after the break, on the graph's tensor, which allows it
            self.raise_if_inference_misuse(state, "Tensor.requires_grad_()", lambda t: t.detach().requires_grad_())
        raise GraphBreak("autograd_flags", f"Tensor.{name}() changes a tensor's requires_grad")

    def raise_if_inference_misuse(self, state, what: str, use) -> None:
        """Eager raises at this `use` of a tensor an inference-mode block made, outside the block
        (`kiln.capture.breaks.inference_tensor_misuse`): tried on the fake, an inference tensor where eager's is."""
        if state.inference_mode or not self.fake.is_inference():
            return
        try:
            use(self.fake)
        except RuntimeError as e:
            if breaks_inference_rule(e):
                raise inference_tensor_misuse(what, e) from e

    def size_value(self, state) -> Value:
        """`t.shape`: a constant torch.Size, or a SizeValue whose dynamic entries are symbolic."""
        # a size already specialized (its expression a number) is a plain int: a SymInt does not hash (dict keys)
        shape = [n if _has_symbols(n) else int(n) for n in self.fake.shape]
        if not _has_symbols(shape):
            return ConstantValue(torch.Size(shape))

        return SizeValue([trace_op(state, "call_method", "size", [self, ConstantValue(d)], {}) if _has_symbols(n)
                          else ConstantValue(n) for d, n in enumerate(shape)])

    def getitem(self, state, key: Value) -> Value:
        key = key.realize()
        if isinstance(key, SymValue) and key.python_type() is int:
            # `x[n]` for a symbolic int: indexing reads the index with `__index__`, which specializes it;
            # `select` takes it as a SymInt, so the graph serves every n within the bounds it guards (as torch)
            return trace_op(state, "call_function", torch.select, [self, ConstantValue(0), key], {})
        return trace_op(state, "call_function", operator.getitem, [self, key], {})

    def setitem(self, state, key: Value, value: Value) -> None:
        trace_op(state, "call_function", operator.setitem, [self, key, value], {})

    def unpack(self, state) -> list[Value]:
        if self.fake.dim() == 0:
            raise GraphBreak("exception", "iteration over a 0-d tensor")
        return [self.getitem(state, ConstantValue(i)) for i in range(self.fake.shape[0])]

    def length(self, state) -> int:
        """The first size as a Python int: a symbolic size is specialized (the shape environment guards it)."""
        return int(self._first_size())

    def len_value(self, state) -> Value:
        """`len(t)`: the first size, symbolic when that dimension is dynamic (never a raw SymInt constant,
        which the graph would print as a name nothing binds)."""
        size = self._first_size()
        if not _has_symbols(size):
            return ConstantValue(size)
        return trace_op(state, "call_method", "size", [self, ConstantValue(0)], {})

    def _first_size(self):
        if self.fake.dim() == 0:
            raise GraphBreak("exception", "len() of a 0-d tensor")
        return self.fake.shape[0]

    def truth(self, state) -> bool:
        """`if t:`: a graph break, except for a one-element comparison whose value no draw changes
        (`torch.rand([]) < 0.0`, value_bounds.py)."""
        if self.known_truth is not None and self.fake.numel() == 1:
            return self.known_truth
        raise GraphBreak("data_dependent_branch", "the truth value of a tensor")

    def reconstruct(self, writer) -> str:
        return writer.tensor(self)

    def __repr__(self) -> str:
        return f"Tensor({self.node.name}: {tuple(self.fake.shape)} {self.fake.dtype})"


class TensorMethodValue(Value):
    """`t.add` before it is called."""

    def __init__(self, tensor: TensorValue, name: str):
        self.tensor, self.name = tensor, name

    def python_type(self) -> type:
        return type(getattr(torch.Tensor([]), self.name))

    def call(self, state, args, kwargs) -> Value:
        return self.tensor.call_method(state, self.name, args, kwargs)

    def reconstruct(self, writer) -> str:
        return f"{writer.value(self.tensor)}.{self.name}"

    def __repr__(self) -> str:
        return f"TensorMethod({self.name})"


# The dtype that holds `.item()` of a tensor exactly, and the Python type `.item()` returns.
_FLOAT, _INT, _BOOL = (torch.float64, float), (torch.int64, int), (torch.bool, bool)


class ItemValue(Value):
    """The Python number `t.item()` would give, held as the 0-d graph tensor `tensor` (of a dtype holding it
    exactly); `kind` is its Python type."""

    def __init__(self, tensor: TensorValue, kind: type):
        self.tensor, self.kind = tensor, kind

    def python_type(self) -> type:
        return self.kind

    def as_constant(self):
        raise GraphBreak("tensor_to_python", "Tensor.item() read as a Python number")

    def truth(self, state) -> bool:
        raise GraphBreak("data_dependent_branch", "a Python branch on the value of Tensor.item()")

    def reconstruct(self, writer) -> str:
        return f"{writer.value(self.tensor)}.item()"

    def __repr__(self) -> str:
        return f"Item({self.kind.__name__} of {self.tensor})"


def item_of(state, tensor: TensorValue) -> Value:
    """`tensor.item()` kept in the graph; a break where `.item()` raises in eager or gives a complex number."""
    fake = tensor.fake
    if fake.is_complex() or not isinstance(fake.numel(), int) or fake.numel() != 1:
        raise GraphBreak("tensor_to_python", "Tensor.item()")
    dtype, kind = _BOOL if fake.dtype == torch.bool else _FLOAT if fake.is_floating_point() else _INT
    exact = trace_op(state, "call_method", "to", [tensor, ConstantValue(dtype)], {})
    return ItemValue(trace_op(state, "call_method", "reshape", [exact, ConstantValue(())], {}), kind)



# ------------------------------------------------------------------------------------------
# Recording an op
# ------------------------------------------------------------------------------------------

def trace_op(state, kind: str, target: Any, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """Record `target(*args, **kwargs)` in the graph and wrap its fake result as trackers."""
    node_args, fake_args = _lower_all(state, args)
    node_kwargs, fake_kwargs = {}, {}
    for k, v in kwargs.items():
        node_kwargs[k], fake_kwargs[k] = _lower(state, v)
    state.switches.check_op(target, tuple(fake_args), fake_kwargs)
    node, fake = state.graph.call(kind, target, tuple(node_args), node_kwargs, tuple(fake_args), fake_kwargs)
    returned = _returned_argument(fake, [*args, *kwargs.values()])
    if returned is None:
        returned = returned_input(target, args, kwargs)
    if returned is not None:
        return returned
    result = wrap_result(state, node, fake)
    if isinstance(result, TensorValue):
        _note_bounds(result, target, args)
    return result


def _note_bounds(result: TensorValue, target: Any, args: list[Value]) -> None:
    """What value_bounds.py knows of `result`, made by `target(*args)`: the range of a uniform draw, the truth of
    its comparison with a constant outside that range."""
    try:
        result.bounds = value_bounds.bounds_of(target, result.fake)
        if len(args) != 2 or target not in value_bounds.COMPARISONS:
            return
    except TypeError:  # an unhashable target: none of these
        return
    first, second = (a.realize() for a in args)
    if isinstance(first, TensorValue) and first.bounds is not None and second.is_constant():
        result.known_truth = value_bounds.known_comparison(target, True, first.bounds, second.as_constant())
    elif isinstance(second, TensorValue) and second.bounds is not None and first.is_constant():
        result.known_truth = value_bounds.known_comparison(target, False, second.bounds, first.as_constant())


def _returned_argument(fake: Any, args: list[Value]) -> Value | None:
    """The argument an op returned as itself (`x.add_(1)`, `out=` ops, `x.contiguous()` of a contiguous x):
    its own tracker, so `y = x.add_(1); y is x` holds as in eager. The op's node stays in the graph."""
    if not isinstance(fake, torch.Tensor):
        return None
    for arg in args:
        arg = arg.realize()
        if isinstance(arg, TensorValue) and arg.fake is fake:
            return arg
    return None


def _lower_all(state, values: list[Value]) -> tuple[list, list]:
    nodes, fakes = [], []
    for v in values:
        n, f = _lower(state, v)
        nodes.append(n)
        fakes.append(f)
    return nodes, fakes


def _lower(state, value: Value) -> tuple[Any, Any]:
    """A tracker as (graph argument, fake argument)."""
    from kiln.capture.values.dicts import DictValue

    value = value.realize()
    if isinstance(value, (TensorValue, SymValue)):
        return value.node, value.fake
    if isinstance(value, (TupleValue, ListValue)):
        nodes, fakes = _lower_all(state, value.items)
        kind = tuple if isinstance(value, TupleValue) else list
        return kind(nodes), kind(fakes)
    if isinstance(value, SliceValue):
        parts = [_lower(state, p) for p in (value.start, value.stop, value.step)]
        return slice(*(p[0] for p in parts)), slice(*(p[1] for p in parts))
    if isinstance(value, DictValue):
        pairs = {k: _lower(state, v) for k, v in value.items.items()}
        return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
    if value.is_constant():
        c = value.as_constant()
        if isinstance(c, torch.Tensor):  # a tracker bug, never a constant: the graph would bake in a fake tensor
            raise GraphBreak("unsupported_object", f"a tensor held as a Python constant ({value})")
        return c, c
    raise GraphBreak("unsupported_object", f"{value} passed to a torch operation")


def _has_symbols(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return any(_has_symbols(v) for v in value)
    return is_symbolic(value)


def wrap_result(state, node: fx.Node, fake: Any) -> Value:
    """Trackers for an op's result: tensors, symbolic sizes, tuples of those (structseqs too), or constants."""
    if isinstance(fake, torch.Tensor):
        return TensorValue(node, fake)
    if isinstance(fake, SYM_TYPES):
        return SymValue(node, fake) if is_symbolic(fake) else ConstantValue(SymValue(node, fake).as_constant())
    if isinstance(fake, (tuple, list)) and any(isinstance(f, torch.Tensor) or is_symbolic(f) for f in fake):
        items = [wrap_result(state, state.graph.getitem(node, i, f), f) for i, f in enumerate(fake)]
        if isinstance(fake, list):
            return ListValue(items)
        return TupleValue(items, cls=type(fake))
    if fake is None or isinstance(fake, (int, float, bool, torch.Size, torch.dtype, torch.device)):
        return ConstantValue(fake)
    raise GraphBreak("unsupported_object", f"an op returned {type(fake).__name__}")
