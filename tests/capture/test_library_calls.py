"""Reaching torch and Python objects in the ways model code does: unbound Tensor methods,
imports inside the function, type checks on tensors and parameters, class names,
getattr on modules by name, mixins."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from support.capture import check, check_module, t


def unbound_tensor_method(x, y):
    return torch.Tensor.add(x, y), torch.Tensor.relu(x)


def import_inside(x):
    import math

    import torch.nn.functional as G
    from torch.nn import functional as H
    return G.relu(x) + H.gelu(x) * math.e


def type_checks(x):
    out = x
    if type(x) is torch.Tensor:
        out = out + 1
    if isinstance(x, nn.Parameter):
        out = out * 100
    if torch.is_tensor(x):
        out = out * 2
    return out


def getattr_by_name(x, act):
    return getattr(F, act)(x), getattr(torch, "tanh")(x), getattr(x, "sigmoid")()


def dtype_helpers(x):
    info = torch.finfo(x.dtype)
    return x.clamp(min=info.min, max=info.max) * info.eps, torch.get_default_dtype()


def tensor_new_helpers(x):
    return torch.zeros_like(x, dtype=torch.int64), torch.full_like(x, 3.0), x.new_tensor([1.0, 2.0, 3.0])


def device_and_dtype_args(x):
    y = torch.ones(3, device=x.device, dtype=x.dtype)
    return x.to(device=x.device, dtype=torch.float64) + y.double()


CASES = [
    (unbound_tensor_method, (t(3, grad=True), t(3))),
    (import_inside, (t(3),)),
    (type_checks, (t(3),)),
    (getattr_by_name, (t(3), "silu")),
    (dtype_helpers, (t(3),)),
    (tensor_new_helpers, (t(3),)),
    (device_and_dtype_args, (t(3, grad=True),)),
]


@pytest.mark.parametrize("fn,args", CASES, ids=[c[0].__name__ for c in CASES])
def test_library_calls_one_graph(fn, args):
    check(fn, *args, graphs=1, records=1, fullgraph=True)


def test_parameter_type_check():
    p = nn.Parameter(torch.randn(3))
    check(type_checks, p, graphs=1, fullgraph=True)


class ScaleMixin:
    def scale(self, x):
        return x * self.factor


class WithMixin(ScaleMixin, nn.Module):
    def __init__(self):
        super().__init__()
        self.factor = 2.0
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        name = type(self).__name__ + self.__class__.__name__
        return self.scale(self.fc(x)) * len(name)


class ParamCheck(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x):
        n = sum(p.numel() for p in self.parameters())
        if isinstance(self.w, nn.Parameter):
            x = x * 2
        return x * self.w + n


class NamedParams(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3, bias=False)

    def forward(self, x):
        total = 0
        for name, p in self.named_parameters():
            if name.endswith("weight"):
                total = total + p.sum()
        return self.b(self.a(x)) + total


@pytest.mark.parametrize("make", [WithMixin, ParamCheck, NamedParams], ids=lambda m: m.__name__)
def test_module_patterns(make):
    check_module(make, t(2, 3, grad=True), graphs=1, fullgraph=True)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        n = sum(p.numel() for p in self.parameters())
        same = self.head.weight is self.emb.weight
        return self.head(self.emb(idx)) + n + int(same)


def test_tied_weights_identity_and_untying():
    import kiln
    from kiln.api import context_of

    torch.manual_seed(0)
    m = Tied()
    c = kiln.compile(m, backend="eager", fullgraph=True)
    idx = torch.tensor([[0, 3]])
    torch.testing.assert_close(c(idx), m(idx))
    m.head.weight = nn.Parameter(m.emb.weight.detach().clone())  # untie: parameters() now yields one more
    torch.testing.assert_close(c(idx), m(idx))
    assert len(context_of(c).records) == 2


class MyTensor(torch.Tensor):
    pass


def test_isinstance_on_tensor_subclass_input():
    def fn(x):
        return x * (2 if isinstance(x, MyTensor) else 3)

    import kiln

    c = kiln.compile(fn, backend="eager")
    plain = t(3)
    sub = t(3).as_subclass(MyTensor)
    torch.testing.assert_close(c(plain), plain * 3)
    out = c(sub)
    torch.testing.assert_close(out.as_subclass(torch.Tensor), sub.as_subclass(torch.Tensor) * 2)


def test_dispatch_mode_stack_query_is_a_constant():
    """torch 2.11's MultiheadAttention asks this in eval mode; it must not become a graph op."""
    import torch.utils._python_dispatch as pd

    def fn(x):
        return x * (2 if len(pd._get_current_dispatch_mode_stack()) == 0 else 3)

    check(fn, t(3), graphs=1, fullgraph=True)
