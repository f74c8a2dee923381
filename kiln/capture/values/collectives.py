"""torch.distributed's collectives during capture: in-place calls become functional collectives.

`dist.all_reduce(t)` and its siblings write their result into a tensor and hand the process group to c10d
as an opaque object. Captured as they are, the ATen graph would hold that object (a ScriptObject kiln's
code generator cannot pass around) and an in-place op it cannot reorder. Each is recorded instead as
torch's functional form (`torch.distributed._functional_collectives`): `t.copy_(all_reduce(t, "sum",
group))`, whose ATen ops take the group by name and return a tensor that a `wait_tensor` completes, so the
code generator runs them as externs and waits as late as their users allow. torch.compile rewrites the
same calls the same way. An asynchronous call (`async_op=True`) returns a Work object the graph cannot
hold: a graph break.
"""
from __future__ import annotations

from collections.abc import Callable

from kiln.capture.breaks import GraphBreak
from kiln.capture.values.base import Value
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.tensor import trace_op

try:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import DeviceMesh
except ImportError:  # a torch built without torch.distributed
    dist = funcol = DeviceMesh = None

# Process groups and device meshes: fixed objects capture guards by identity and passes to collectives by name.
DISTRIBUTED_HANDLES: tuple[type, ...] = () if dist is None else (dist.ProcessGroup, DeviceMesh)

# dist.<name> -> the functional collective's in-place form, which takes the same arguments.
_FUNCTIONAL_FORMS = {
    "all_reduce": "all_reduce_inplace",
    "all_gather_into_tensor": "all_gather_tensor_inplace",
    "all_gather_single": "all_gather_tensor_inplace",  # all_gather_into_tensor's newer name
    "reduce_scatter_single": "reduce_scatter_tensor_inplace",
    "_all_gather_base": "all_gather_tensor_inplace",
    "reduce_scatter_tensor": "reduce_scatter_tensor_inplace",
    "_reduce_scatter_base": "reduce_scatter_tensor_inplace",
    "all_to_all_single": "all_to_all_inplace",
    "all_gather": "all_gather_inplace",
}


def _functional_forms() -> dict[Callable, Callable]:
    if dist is None or not dist.is_available():
        return {}
    return {getattr(dist, name): getattr(funcol, form) for name, form in _FUNCTIONAL_FORMS.items()
            if hasattr(dist, name) and hasattr(funcol, form)}


FUNCTIONAL_FORMS: dict[Callable, Callable] = _functional_forms()


def is_collective(fn: Callable) -> bool:
    """A dist.* collective kiln rewrites, or a functional collective (recorded as it is)."""
    return fn in FUNCTIONAL_FORMS or (funcol is not None and getattr(fn, "__module__", None) == funcol.__name__)


def _as_graph_constant(value: Value) -> Value:
    """What a collective's argument becomes in the graph: a `dist.ReduceOp` its name ("sum", ...), a process
    group its name. The group object is c10d's, with no Python source form: by name, the graph prints, the
    functional collectives find the group again, and the ATen graph holds strings, not a ScriptObject."""
    if not value.is_constant():
        return value
    constant = value.as_constant()
    if isinstance(constant, dist.ProcessGroup):
        return ConstantValue(constant.group_name)
    if isinstance(constant, DeviceMesh) and constant.ndim == 1:
        return ConstantValue(constant.get_group().group_name)
    if isinstance(constant, (list, tuple)) or not _hashable(constant):
        return value
    if constant in funcol.REDUCE_OP_TO_STR:
        return ConstantValue(funcol.REDUCE_OP_TO_STR[constant])
    return value


def _hashable(obj) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


def trace_collective(state, fn: Callable, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """`fn(*args, **kwargs)` recorded with its group and reduce op by name; a dist.* collective as its
    functional form, returning None as the synchronous call does."""
    args = [_as_graph_constant(a) for a in args]
    kwargs = {name: _as_graph_constant(v) for name, v in kwargs.items()}
    if fn not in FUNCTIONAL_FORMS:
        return trace_op(state, "call_function", fn, args, kwargs)
    async_op = kwargs.pop("async_op", None)
    if async_op is not None and (not async_op.is_constant() or async_op.as_constant()):
        raise GraphBreak("unsupported_call", f"torch.distributed.{fn.__name__}(async_op=True) returns a Work "
                                             "object a graph cannot hold")
    trace_op(state, "call_function", FUNCTIONAL_FORMS[fn], args, kwargs)
    return ConstantValue(None)
