"""Shape-relation guards: the sizes a dynamic graph assumed equal (or constant) must be checked on every call.

Inputs named like the placeholders of torch's guard expressions:
`produce_guards_expression` names the graph's i-th tensor `L['t{i}']`; kiln substitutes each input's own
expression. A user's local named `t1` (a common name) also reads `L['t1']`: substituted one name at a time,
a relation `L['t3'].size()[0] == L['t1'].size()[0]` became `W.size()[0] == W.size()[0]` (always true), the
graph's assumption that two sizes are equal went unchecked, and a later call with sizes that differ reused a
graph specialized to the old ones: outputs of the wrong shape, no error.

Inputs with dynamic dims whose sizes all became constants (duck-sized to a size that a parameter's static
shape then specialized): no tensor guard checks them, so their relations (`u1.size()[0] == 3`) must stay.
"""
import pytest
import torch

import kiln

W = torch.randn(3, 3)


def resumed_with_a_local_named_t1(d):
    t1 = d.chunk(2, dim=0)[0] * 2
    kept = len(d[d > 0])  # a data-dependent break: the rest resumes with t1 among its inputs
    t4 = d @ W
    return t1 + 1, t4.sum() * 0 + kept * 0


def arguments_named_like_placeholders(t2, t0, t1):  # the i-th input is not the one named t{i}
    return t2 @ W + t0[:, :1], t1 * 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_local_named_t1_keeps_its_size_guard(backend):
    compiled = kiln.compile(resumed_with_a_local_named_t1, backend=backend, dynamic=True)
    for n in (3, 5, 7, 9):  # call 2 has t1 of 3 rows, duck-sized with W's 3: the relation must be guarded
        d = torch.linspace(-1.0, 1.0, 3 * n).reshape(n, 3)
        expected, actual = resumed_with_a_local_named_t1(d), compiled(d)
        torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_arguments_named_t0_t1_t2_keep_their_relations(backend):
    compiled = kiln.compile(arguments_named_like_placeholders, backend=backend, dynamic=True)
    for rows, other in ((3, 3), (4, 3), (3, 5), (6, 2)):  # sizes equal to W's first, then not
        args = (torch.randn(rows, 3), torch.randn(rows, 2), torch.randn(other, rows))
        torch.testing.assert_close(compiled(*args), arguments_named_like_placeholders(*args))


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 9).reshape(3, 3))

    def forward(self, x):
        return x @ self.weight


LINEAR = Linear()


def resumed_beside_a_parameter(d):
    half = d.chunk(2, dim=0)[0] * 2
    kept = len(d[d > 0])  # resumes with `half`, whose 3 rows at call 1 equal the parameter's static 3
    LINEAR(d)
    return half + kept * 0


def sizes_equal_to_a_parameter_s(x, y):
    return x @ LINEAR.weight, y + 1  # y's rows first equal x's columns (3), later not


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_input_specialized_to_a_parameter_size_keeps_its_guard(backend):
    compiled = kiln.compile(resumed_beside_a_parameter, backend=backend, dynamic=True)
    for n in (3, 5, 7, 9):
        d = torch.linspace(-1.0, 1.0, 3 * n).reshape(n, 3)
        torch.testing.assert_close(compiled(d), resumed_beside_a_parameter(d))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_sizes_duck_sized_with_a_specialized_size(backend):
    compiled = kiln.compile(sizes_equal_to_a_parameter_s, backend=backend, dynamic=True)
    for rows, other in ((4, 3), (5, 3), (5, 6), (2, 2)):
        args = (torch.randn(rows, 3), torch.randn(other, 3))
        torch.testing.assert_close(compiled(*args), sizes_equal_to_a_parameter_s(*args))
