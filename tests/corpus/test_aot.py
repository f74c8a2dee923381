"""AOTAutograd behaviours as test_aot_autograd and functorch's test_aotdispatch exercise them, run through kiln's
autograd stage (backend="aot_eager"): input mutations (data and metadata), outputs that alias inputs or each
other, mixes of inputs that do and do not require grad, no_grad regions and detach inside the graph, and
multiple outputs with some non-differentiable. A few run through the default backend (generated code)."""
import pytest
import torch

from support.autograd import Cube

from .reference import Table, check, t

torch.manual_seed(0)
cases = Table()
A, B = t(4), t(4)
GA, GB = t(4, grad=True), t(4, grad=True)
GM = t(3, 4, grad=True)
M = t(3, 4)
# --- input mutations --------------------------------------------------------------------------------------------


@cases((A,))
def mutate_input_data(a):
    a.mul_(2)
    return a + 1


@cases((A, B))
def mutate_one_of_two_inputs(a, b):
    b.add_(a)
    return a * b


@cases((M,))
def mutate_slice_of_input(m):
    m[1].add_(1)
    return m.sum(0)


@cases((M,))
def mutate_input_through_view(m):
    v = m.view(-1)
    v[::2] = 0.0
    return m * 2


@cases((M,))
def mutate_input_transposed_view(m):
    m.t()[0].mul_(10)
    return m.clone()


@cases((A,))
def mutate_input_only_no_output(a):
    a.sub_(1)


@cases((A,))
def mutate_input_returned_as_is(a):
    a.add_(3)
    return a


@cases((A,))
def mutate_input_twice(a):
    a.mul_(2)
    a.add_(1)
    return a.sum()


@cases((M,))
def metadata_mutation_transpose_(m):
    m.t_()
    return m + 1


@cases((M,))
def metadata_mutation_unsqueeze_(m):
    m.unsqueeze_(0)
    return m.shape


@cases((A, A))
def mutation_of_input_used_later(a, b):
    c = a * 2
    a.add_(1)
    return c + a + b


@cases((t(4, dtype=torch.int64),))
def mutate_integer_input(n):
    n.add_(5)
    return n * 2


@cases((A,))
def mutate_input_under_no_grad(a):
    with torch.no_grad():
        a.add_(1)
    return a * 2


@cases((GA,))
def mutate_clone_of_grad_input(x):
    y = x.clone()
    y.mul_(3)
    return y


# --- inputs that alias each other (the same tensor, or a view of another input) ----------------------------------

SHARED = t(6)


@cases((SHARED, SHARED[:3]))
def mutate_input_whose_view_is_another_input(a, b):
    a.add_(1)
    return b * 2


@cases((SHARED, SHARED[2:]))
def mutate_view_input_read_base(a, b):
    b.mul_(3)
    return a.sum()


@cases((SHARED, SHARED))
def same_tensor_twice_read_only(a, b):
    return a * b + a


@cases((SHARED[:3], SHARED[3:]))
def disjoint_views_of_one_base(a, b):
    a.add_(1)
    return a + b


# --- outputs that alias ---------------------------------------------------------------------------------------


@cases((A,))
def output_is_input(a):
    return a


@cases((M,))
def output_views_input(m):
    return m.view(-1), m[0], m.t()


@cases((GM,))
def output_views_grad_input(m):
    return m[1:], m.transpose(0, 1)


@cases((A,))
def output_view_and_base_intermediate(a):
    b = a * 2
    return b, b.view(2, 2)


@cases((A,))
def two_views_of_one_intermediate(a):
    b = a + 1
    return b[:2], b[2:]


@cases((t(8),))
def overlapping_strided_views(a):
    b = a + 1
    return b[::2], b[1:][:2]


@cases((GA,))
def output_and_its_detach(x):
    y = x * 2
    return y, y.detach()


@cases((GA,))
def output_view_then_mutated_base(x):
    y = x * 2
    v = y[:2]
    y.add_(1)
    return v, y


@cases((M,))
def view_of_input_mutated_and_returned(m):
    v = m[0]
    v.mul_(2)
    return v


@cases((A,))
def output_unsqueezed_input(a):
    return a.unsqueeze(0), a.reshape(2, 2)


@cases((A,))
def input_returned_twice(a):
    return a, a


@cases((A,))
def alias_of_output_returned_twice(a):
    b = a.sin()
    return b, b


# --- requires_grad mixes ----------------------------------------------------------------------------------------


@cases((GA, B))
def grad_and_plain_inputs(x, y):
    return x * y + y


@cases((GA, GB))
def both_require_grad(x, y):
    return (x * y).sum(), x - y


@cases((GA, GB))
def unused_grad_input(x, y):
    return x * 2


@cases((GA,))
def output_does_not_require_grad(x):
    return x * 2, torch.ones(2), x.shape[0]


@cases((GA,))
def no_grad_region_inside(x):
    with torch.no_grad():
        y = x * 2
    return x * y


@cases((GA,))
def detach_inside(x):
    y = x.detach() * 3
    return x * y


@cases((GA,))
def integer_output_with_grad_input(x):
    return x.argmax(), (x > 0).sum(), x.sum()


@cases((GA,))
def requires_grad_created_inside(x):
    w = torch.ones(4, requires_grad=True)
    return x * w


@cases((GM,))
def grad_through_views(m):
    return m.view(12)[3:9].sum() + m[:, 1].pow(2).sum()


@cases((GM,))
def grad_through_inplace_on_clone(m):
    c = m.clone()
    c[0] = 0.0
    c.mul_(2)
    return c.sum(1)


@cases((GA,))
def grad_of_nondifferentiable_op(x):
    return x.round() + x.sign() + x * 2


@cases((GA,))
def grad_through_where(x):
    return torch.where(x > 0, x * x, -x)


@cases((GM,))
def grad_through_reductions(m):
    return m.max(1).values + m.logsumexp(1) + m.norm(dim=1)


@cases((GA, GB))
def grad_through_stack_and_split(x, y):
    s = torch.stack([x, y])
    p, q = s.split(1)
    return p * q


@cases((GA,))
def grad_through_dtype_cast(x):
    return x.double().sin().float()


@cases((GA,))
def grad_with_integer_pow(x):
    return x ** 3 - 2 * x ** 2


@cases((GA,))
def grad_through_softmax_and_log(x):
    return torch.log_softmax(x, 0) * torch.softmax(x, 0)


@cases((GM, t(4, 2, grad=True)))
def grad_through_matmul(m, w):
    return (m @ w).relu()


@cases((GA,))
def grad_through_cumsum_and_flip(x):
    return x.cumsum(0).flip(0)


@cases((GA,))
def grad_through_expand(x):
    return x[None, :].expand(3, 4) * torch.arange(3.0)[:, None]


@cases((GA, B))
def grad_through_index_put(x, y):
    out = torch.zeros(4)
    out = out.index_put((torch.tensor([1, 3]),), x[:2])
    return out + y


@cases((GM,))
def grad_through_gather_scatter(m):
    idx = torch.tensor([[0, 1], [2, 3], [3, 0]])
    g = m.gather(1, idx)
    return torch.zeros(3, 4).scatter_add(1, idx, g)


@cases((GA,))
def grad_with_graph_break(x):
    y = x * 2
    _ = y.sum().item()
    return y.sin()


@cases((GA,))
def grad_after_no_grad_break(x):
    with torch.no_grad():
        y = x * 2
        print(end="")
    return y, x * y


@cases((GA,))
def custom_autograd_function(x):
    return Cube.apply(x)


@pytest.mark.parametrize("fn, calls, options", cases.params)
def test_aot_case_matches_eager(fn, calls, options):
    check(fn, *calls, backend="aot_eager", **options)


DEFAULT_BACKEND = [
    pytest.param(mutate_slice_of_input, (M,), id="mutate_slice_of_input"),
    pytest.param(output_views_input, (M,), id="output_views_input"),
    pytest.param(grad_and_plain_inputs, (GA, B), id="grad_and_plain_inputs"),
    pytest.param(grad_through_inplace_on_clone, (GM,), id="grad_through_inplace_on_clone"),
]


@pytest.mark.parametrize("fn, args", DEFAULT_BACKEND)
def test_default_backend_case_matches_eager(fn, args):
    check(fn, args, backend="inductor")
