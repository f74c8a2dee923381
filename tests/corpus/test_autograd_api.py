"""The autograd API used inside compiled code, as Dynamo's autograd tests exercise it: .data and .grad, tensor
hooks, retain_grad, backward() and torch.autograd.grad called inside the function, checkpoint-free recompute,
Parameters created or read inside, and requires_grad_ on intermediates. Run capture-only and through aot_eager."""
import pytest
import torch

from .reference import Table, check, gap, t

torch.manual_seed(0)
cases = Table()
G = t(4, grad=True)
W = t(4, 3, grad=True)
A = t(4)
GRAD_FN = "torch.compile runs a frame that reads .grad_fn eagerly"


@cases((G,))
def read_data_attribute(x):
    return x.data * 2 + x


@cases((G,))
def write_through_data(x):
    y = x * 3
    y.data.mul_(0)
    return y


@cases((G,), torch_gives_up=GRAD_FN)
def is_leaf_and_grad_fn(x):
    y = x * 2
    return y, x.is_leaf, y.is_leaf, y.grad_fn is not None


@cases((G,))
def grad_attribute_is_none(x):
    return x * 2 if x.grad is None else x


@cases((G,))
def tensor_hook_scales_gradient(x):
    y = x * 2
    y.register_hook(lambda g: g * 10)
    return y.sin()


@cases((G,), torch_gives_up="torch.compile runs a frame that calls retain_grad() eagerly")
def retain_grad_on_intermediate(x):
    y = x * 2
    y.retain_grad()
    return y.cos()


@cases((G,))
def backward_inside(x):
    loss = (x * x).sum()
    loss.backward()
    return x.grad * 1


@cases((G,))
def autograd_grad_inside(x):
    y = (x ** 3).sum()
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    return g


@cases((G,))
def requires_grad_on_intermediate_copy(x):
    y = x.detach().clone().requires_grad_()
    return y * 2, x * 3


@cases((A,))
def parameter_created_inside(a):
    p = torch.nn.Parameter(torch.ones(4))
    return a * p


@cases((G, W))
def linear_with_weight_input(x, w):
    return torch.nn.functional.linear(x[None, :], w.t())


@cases((G,))
def detach_then_mutate_copy(x):
    y = x.detach().clone()
    y.add_(1)
    return x * y


@cases((G,))
def no_grad_output_mixed(x):
    with torch.no_grad():
        frozen = x * 2
    live = x * 3
    return frozen, live, frozen + live


@cases((G,))
def enable_grad_output_from_no_grad_input(x):
    with torch.no_grad():
        base = x + 1
    with torch.enable_grad():
        return base * x


@cases((G,))
def grad_of_max_and_sort(x):
    return x.max(), x.sort().values[:2].sum()


@cases((G,))
def grad_through_clone_and_setitem(x):
    y = torch.zeros(6)
    y[1:5] = x
    return y * 2


@cases((G,))
def grad_through_python_scalars(x):
    s = 3.0
    for _ in range(2):
        s = s * 0.5
    return x * s + x ** 2 * s


@cases((G,))
def grad_through_repeated_use(x):
    return x * x * x + x.exp() - x.log1p().abs()


@cases((G,))
def output_requires_grad_false_from_int_cast(x):
    return x.long(), x.argmax(), x > 0


@cases((G,))
def grad_through_narrow_and_cat(x):
    return torch.cat([x.narrow(0, 2, 2), x.narrow(0, 0, 2) * 2])


KNOWN = {
    ("tensor_hook_scales_gradient", "eager"): gap("Tensor.register_hook on an intermediate breaks the graph"),
    ("tensor_hook_scales_gradient", "aot_eager"): gap("Tensor.register_hook on an intermediate breaks the graph"),
}


@pytest.mark.parametrize("fn, calls, options, backend", [
    pytest.param(*p.values, backend, id=f"{p.id}-{backend}", marks=KNOWN.get((p.id, backend), ()))
    for p in cases.params for backend in ("eager", "aot_eager")])
def test_autograd_api_case_matches_eager(fn, calls, options, backend):
    check(fn, *calls, backend=backend, **options)
