"""Changing input sizes, as Dynamo's dynamic-shape and recompile tests exercise them: a second size recompiles
once into a dynamic graph (automatic dynamic) and a third size reuses it; sizes read into Python (shape
arithmetic, loops over a dimension, sizes stored into Python state); changing dtype, rank or requires_grad
recompiles; dynamic=True and dynamic=False; and the same through the autograd stage."""
import pytest
import torch

from .reference import Table, check, globals_state, t

torch.manual_seed(0)
cases = Table()
SHAPES = {}


def sizes(*lengths, grad=False):
    """One call per length, each on a fresh (length, 4) tensor."""
    return [(t(n, 4, grad=grad),) for n in lengths]


def sizes2(*lengths):
    """One call per length with two arguments that share the leading size."""
    return [(t(n, 4), t(n, 4)) for n in lengths]


@cases(*sizes(2, 3, 5))
def pointwise(x):
    return x.sin() * 2 + 1


@cases(*sizes(2, 3, 5))
def reduction_over_dynamic_dim(x):
    return x.sum(0), x.mean(), x.softmax(0)


@cases(*sizes(2, 3, 5))
def view_with_size_arithmetic(x):
    return x.view(x.shape[0] * 2, -1), x.reshape(-1, x.size(0))


@cases(*sizes(2, 3, 5))
def size_in_python_arithmetic(x):
    n = x.shape[0]
    return x * (n + 1) / (n * 2)


@cases(*sizes(2, 3, 5))
def new_tensor_from_size(x):
    return x + torch.ones(x.shape[0], 1), torch.arange(x.size(0)) * 2, torch.zeros(x.shape)


@cases(*sizes(2, 3, 5))
def slicing_by_size(x):
    half = x.shape[0] // 2
    return x[:half], x[half:], x[-1]


@cases(*sizes(2, 3, 5))
def loop_over_dynamic_dim(x):
    total = torch.zeros(4)
    for i in range(x.shape[0]):
        total = total + x[i]
    return total


@cases(*sizes(2, 3, 5))
def branch_on_size(x):
    return x * 2 if x.shape[0] > 2 else x - 2


@cases(*sizes(2, 3, 5))
def shape_returned(x):
    return x.shape, x.size(0), x.numel(), len(x)


@cases(*sizes(2, 3, 5), state=globals_state(globals(), SHAPES={}))
def shape_stored_in_global(x):
    SHAPES["last"] = tuple(x.shape)
    SHAPES["rows"] = x.shape[0]
    return x + 1


@cases(*sizes(2, 3, 5))
def shape_as_tensor_argument(x):
    return torch.full((x.shape[0],), float(x.shape[1])), x.new_empty(x.shape[0], 2).fill_(1.0)


@cases(*sizes2(2, 3, 5))
def two_inputs_same_size(x, y):
    return torch.cat([x, y]), x @ y.t()


@cases(*sizes(2, 3, 5))
def matmul_dynamic_batch(x):
    return torch.relu(x) @ torch.ones(4, 3)


@cases(*sizes(2, 3, 5))
def expand_to_dynamic(x):
    return torch.ones(1, 4).expand(x.shape[0], 4) + x


@cases(*sizes(2, 3, 5))
def split_by_dynamic(x):
    return x.split(1), x.chunk(2)


@cases(*sizes(2, 3, 5))
def size_to_python_float_and_back(x):
    return x / float(x.shape[0]) + int(x.shape[0] / 2)


@cases(*sizes(2, 3, 5))
def size_in_format_string(x):
    key = f"n={x.shape[0]}"
    return x * len(key)


@cases(*sizes(2, 3, 5))
def size_keyed_dict(x):
    d = {x.shape[0]: "rows", 4: "cols"}
    return x * len(d)


@cases(*sizes(2, 3, 2))
def back_to_first_size(x):
    return x.cos()


@cases((t(4),), (t(4, dtype=torch.float64),))
def dtype_change_recompiles(x):
    return x * 2


@cases((t(4),), (t(2, 2),), (t(2, 2, 2),))
def rank_change_recompiles(x):
    return x.sum(-1)


@cases((t(4),), (t(4, grad=True),))
def requires_grad_change(x):
    return x * 3


@cases((t(4), 2), (t(4), 3), (t(4), 4))
def int_argument_changes(x, n):
    return x * n


@cases((t(4), 2), (t(4), 3), (t(4, dtype=torch.int32), 4), (t(4, dtype=torch.bool), 5), (t(4), -7))
@cases((t(4, grad=True), 2), (t(4, grad=True), 3), (t(4, grad=True), 9), backend="aot_eager")
@cases((t(4, grad=True), 2), (t(4, grad=True), 3), (t(4, grad=True), 9), backend="inductor")
def int_argument_in_tensor_arithmetic_keeps_dtypes(x, n):
    return x * n + n, n - x, x // n if not x.is_floating_point() else x / n, (x > n).sum()


@cases((t(4), 0.5), (t(4), 1.5), (t(4, dtype=torch.float64), 0.1), (t(4, dtype=torch.int32), 2.5),
       (t(4, dtype=torch.float16), 3.25))
def float_argument_in_tensor_arithmetic_keeps_dtypes(x, s):
    return x * s + s, s - x, x / s


# An int read as a dim or a size through arithmetic is guarded as that expression (`(n % 2) == 1`), as
# torch.compile guards its SymInt expression: the next n with the same remainder reuses the graph.
@cases((t(3, 4), 2), (t(3, 4), 3), (t(3, 4), 1))
def int_argument_as_a_dim_is_specialized(x, n):
    return x.sum(dim=n % 2) * n


@cases((t(3, 4), 0), (t(3, 4), 1), (t(3, 4), 0), (t(3, 4), -1))
def int_argument_as_a_dim_directly(x, n):
    return x.sum(dim=n)


@cases((t(3, 4), 1), (t(3, 4), 2), (t(3, 4), 1))
def int_argument_offset_as_a_dim(x, n):
    return x.softmax(dim=n - 1) + n


@cases((t(4), 4), (t(4), 5), (t(4), 7))
def int_argument_halved_as_a_size(x, n):
    return x.new_zeros(n // 2).sum() + x * (n // 2)


@cases((t(3, 4), 3), (t(3, 4), 5), (t(3, 4), 4))
def int_argument_reflected_expression(x, n):
    return x.sum(dim=1 - n % 2), 10 - n


@cases((t(4), 0.5), (t(4), 1.5))
def float_argument_changes(x, s):
    return x + s


@cases((t(4), [1, 2]), (t(4), [1, 2, 3]))
def list_length_changes(x, xs):
    return x * len(xs)


@cases((t(3, 4),), (t(3, 6),), (t(3, 8),))
def inner_dim_changes(x):
    return x.sum(1), x[:, :2]


@cases((t(3, 4),), (t(4, 3).t(),))
def strides_change(x):
    return x + 1


@cases(*sizes(2, 3, 5), dynamic=True)
def dynamic_true(x):
    return x * x.shape[0]


@cases(*sizes(2, 3, 5), dynamic=False)
def dynamic_false(x):
    return x.exp()


@cases(*sizes(2, 3, 5, grad=True), backend="aot_eager")
def aot_dynamic_pointwise(x):
    return (x * 2).sin()


@cases(*sizes(2, 3, 5, grad=True), backend="aot_eager")
def aot_dynamic_reduction_and_view(x):
    return x.view(-1).sum() + x.mean(0)


@cases(*sizes(2, 3, 5), backend="aot_eager")
def aot_dynamic_input_mutation(x):
    x.add_(x.shape[0])
    return x


@cases(*sizes(2, 3, 5), backend="aot_eager")
def aot_dynamic_view_output(x):
    return x[1:], x.t()


@cases(*sizes(2, 3, 5, grad=True), backend="aot_eager")
def aot_dynamic_matmul(x):
    return x @ x.t()


@cases(*sizes(2, 3, 5))
def item_then_size(x):
    s = x.sum().item()
    return x * x.shape[0] + s


@cases((t(4),), (t(4) + 5,), (t(4) - 5,), (t(4) + 6,), (t(4) - 6,), (t(4) + 7,))
def item_feeds_a_branch(x):
    if x.sum().item() > 0:  # the continuation guards the outcome, not the value: one entry per side
        return x + 1
    return x - 1


@cases((t(4), 3), (t(4), 5), (t(4), -1), (t(4), 7), (t(4), -4))
def int_argument_feeds_a_branch(x, n):
    if n > 2:
        return x.sin()
    return x.cos()


@cases((t(4), 0.5), (t(4), 1.5), (t(4), 0.25))
def float_compared_with_another_argument(x, lo, hi=1.0):
    return x * 2 if lo < hi else x * 3


@pytest.mark.parametrize("fn, calls, options", cases.params)
def test_dynamic_case_matches_eager(fn, calls, options):
    check(fn, *calls, **options)


def _inference_relu_matmul(x):
    with torch.no_grad():
        return torch.relu(x) @ torch.ones(4, 4)


@pytest.mark.parametrize("fn", [
    pytest.param(_inference_relu_matmul, id="no_grad_matmul"),
])
def test_dynamic_sizes_on_default_backend(fn):
    check(fn, *sizes(4, 6, 8), backend="inductor")
