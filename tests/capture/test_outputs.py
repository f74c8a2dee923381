"""What a compiled function returns is rebuilt by the output program: every kind of Python
value, with identity and aliasing as in eager."""
import dataclasses

import pytest
import torch

import kiln
from kiln.api import context_of
from support.capture import check, t


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    extra: int = 0


class Plain:
    def __init__(self, a, b):
        self.a = a
        self.b = b


def ret_dataclass(x):
    return Out(x * 2, extra=3)


def ret_plain_object(x):
    return Plain(x + 1, "tag")


def ret_nested(x):
    return {"a": [x, (x * 2, {"b": x * 3})], "c": None, "d": (1, 2.5, "s")}


def ret_metadata(x):
    return x.shape, x.dtype, x.device, torch.Size([2, 3]), slice(1, 2), range(3)


def ret_set_and_frozenset(x):
    return x * 1, {1, 2}, frozenset({3})


def ret_input_unchanged(x, y):
    return y, x


def ret_view_of_input(x):
    return x.view(-1), x[0], x.t()


def ret_int_and_float_from_shapes(x):
    return x.shape[0] * 2, x.shape[1] / 2, x.numel()


def ret_tensor_and_its_view(x):
    y = x * 2
    return y, y.view(-1)


def ret_empty_containers(x):
    return [], {}, (), x * 1


def ret_bool_tensor_and_int_tensor(x):
    return x > 0, (x * 10).long(), x.argmax()


CASES = [
    (ret_dataclass, (t(3, grad=True),)),
    (ret_nested, (t(3, grad=True),)),
    (ret_metadata, (t(2, 3),)),
    (ret_set_and_frozenset, (t(3),)),
    (ret_input_unchanged, (t(3), t(3))),
    (ret_view_of_input, (t(2, 3),)),
    (ret_int_and_float_from_shapes, (t(2, 3),)),
    (ret_tensor_and_its_view, (t(2, 3, grad=True),)),
    (ret_empty_containers, (t(3),)),
    (ret_bool_tensor_and_int_tensor, (t(3),)),
]


def _normalize(out):
    if isinstance(out, Out):
        return ("Out", out.logits, out.extra)
    if isinstance(out, Plain):
        return ("Plain", out.a, out.b)
    return out


@pytest.mark.parametrize("fn,args", CASES, ids=[c[0].__name__ for c in CASES])
def test_outputs_match(fn, args):
    check(lambda *a: _normalize(fn(*a)), *args)
    check(fn, *args) if not isinstance(fn(*args), (Out, Plain)) else None


def test_plain_object_made_in_graph_is_rebuilt():
    c = kiln.compile(ret_plain_object, backend="eager")
    x = t(3)
    out = c(x)
    assert type(out) is Plain and out.b == "tag"
    torch.testing.assert_close(out.a, x + 1)


def test_dataclass_made_in_graph_is_rebuilt():
    c = kiln.compile(ret_dataclass, backend="eager", fullgraph=True)
    x = t(3)
    out = c(x)
    assert type(out) is Out and out.extra == 3
    torch.testing.assert_close(out.logits, x * 2)


def test_view_output_shares_storage_with_input():
    c = kiln.compile(ret_view_of_input, backend="eager")
    x = t(2, 3)
    flat, row, tr = c(x)
    flat[0] = 100.0
    assert x[0, 0] == 100.0
    assert row._base is x or row.data_ptr() == x.data_ptr()


def test_output_view_of_output_aliases():
    c = kiln.compile(ret_tensor_and_its_view, backend="eager")
    y, v = c(t(2, 3))
    v[0] = 7.0
    assert y[0, 0] == 7.0


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.b(self.a(x))


def test_parameters_of_one_submodule_are_fetched_through_one_local():
    model = torch.nn.Sequential(_Block(), _Block())
    c = kiln.compile(model, backend="eager")
    x = t(2, 4)
    torch.testing.assert_close(c(x), model(x))
    (rec,) = context_of(c).records
    program = rec.program_source.split("def program(L, G, C):")[1]
    # L['self']._modules['0'] is read once into a local, not once per parameter under it
    assert program.count("._modules['0']") == 1
    with torch.no_grad():
        model[0].b.weight.mul_(2)  # in place: the next call reads the new values through the locals
    torch.testing.assert_close(c(x), model(x))
