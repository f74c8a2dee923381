"""Errors of eager's kernels that tracing, functionalization or dead-code elimination would lose.

Fake tensors check none of these (internal and partial overlap of a written tensor among them);
functionalization turns an in-place op into its out-of-place variant and a cast-free copy; an unused op would be
dropped with its check. kiln must raise what eager raises (same
exception type and message) and, where eager does not raise, return what eager returns.
"""
import pytest
import torch

import kiln


def in_place_result_cannot_be_cast(a, b):
    mask = a > 0
    mask[1:].mul_(2)  # bool * int is int64: eager cannot write it into the bool tensor
    return a + 1


def in_place_float_into_int(a, b):
    b.add_(0.5)
    return b


def write_into_an_expanded_tensor(a, b):
    e = a.unsqueeze(-1).expand(*a.shape, 3)
    e[:-1] = 0
    return a


def add_into_an_expanded_tensor(a, b):
    e = a[:1].expand(3, 4)
    e.add_(1)
    return e


def unused_bool_subtraction(a, b):
    m = a > 0
    m - 1
    return a * 2


def unused_bool_negation(a, b):
    m = a > 0
    -m  # noqa: B018  (the negation under test: eager raises it on a bool tensor, unused or not)
    return a * 2


def unused_subtraction_of_python_true(a, b):
    a - True  # eager wraps True into a bool tensor and refuses the subtraction
    return a * 2


def unused_python_bool_minus_a_tensor(a, b):
    False - b
    return a * 2


def unused_in_place_subtraction_of_a_bool(a, b):
    c = a.clone()
    c.sub_(True)
    return a + 1


def unused_bool_alpha(a, b):
    torch.sub(a, a, alpha=True)  # a bool alpha is only for bool results
    torch.add(b, b, alpha=False)
    return a * 2


def unused_floor_division(a, b):
    b // (b * 0)
    return a * 2


def unused_remainder(a, b):
    b % (b - b)
    return a.sum()


def unused_rounding_division(a, b):
    torch.div(b, b * 0, rounding_mode="trunc")
    return a + 1


def used_integer_division_by_zero(a, b):
    return b // (b * 0)


def copy_between_overlapping_slices(a, b):
    c = a * 1
    c[1:].copy_(c[:-1])  # the source and the written rows share memory
    return c


def add_overlapping_rows_in_place(a, b):
    c = a + 0
    c[1:].add_(c[:-1])
    return c


def assign_a_shifted_slice(a, b):
    flat = b.view(-1)
    flat[1:] = flat[:-1]
    return b


def out_overlapping_its_input(a, b):
    c = a * 1
    torch.mul(c[:-1], 2, out=c[1:])
    return c


RAISING = [in_place_result_cannot_be_cast, in_place_float_into_int, write_into_an_expanded_tensor,
           add_into_an_expanded_tensor, unused_bool_subtraction, unused_bool_negation,
           unused_subtraction_of_python_true, unused_python_bool_minus_a_tensor, unused_in_place_subtraction_of_a_bool,
           unused_bool_alpha, unused_floor_division,
           unused_remainder, unused_rounding_division, copy_between_overlapping_slices, add_overlapping_rows_in_place,
           assign_a_shifted_slice, out_overlapping_its_input]


def unused_division_without_zero(a, b):
    b // (b * 0 + 2)
    b % 3
    return a * 2


def in_place_that_casts(a, b):
    c = a.clone()
    c.mul_(b)  # float * int64 is float: fine in place
    b.mul_(2)
    return c


def write_into_a_plain_view(a, b):
    e = a.unsqueeze(-1)
    e[:-1] = 0
    return a


def copy_between_disjoint_slices(a, b):
    c = a * 1
    c[2:].copy_(c[:1])  # same storage, no shared element
    c[:, 0].add_(c[:, 1])
    return c


def add_a_tensor_to_itself(a, b):
    c = a * 1
    c.add_(c)  # the same memory, element for element: eager allows it
    c[0].mul_(c[0])
    return c


def python_bools_where_eager_takes_them(a, b):
    m = a > 0
    torch.add(m, m, alpha=True)  # a bool alpha of a bool result
    return a + True, b * False, m & True


RETURNING = [python_bools_where_eager_takes_them, unused_division_without_zero, in_place_that_casts,
             write_into_a_plain_view, copy_between_disjoint_slices,
             add_a_tensor_to_itself]


def make():
    return torch.linspace(-1.0, 1.0, 12).reshape(3, 4), torch.arange(-6, 6).reshape(3, 4)


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", RAISING, ids=lambda f: f.__name__)
def test_raises_what_eager_raises(program, backend):
    check_raises(program, backend)


def test_used_integer_division_by_zero_raises():
    """The graph keeps the division as the ATen op, which raises (a code generator must check it itself)."""
    check_raises(used_integer_division_by_zero, "aot_eager")


def check_raises(program, backend: str) -> None:
    with pytest.raises(Exception) as eager:
        program(*make())
    with pytest.raises(type(eager.value)) as compiled:
        kiln.compile(program, backend=backend)(*make())
    assert str(eager.value).split("\n")[0] in str(compiled.value)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", [copy_between_overlapping_slices, add_overlapping_rows_in_place],
                         ids=lambda f: f.__name__)
def test_partial_overlap_raises_with_dynamic_sizes(program, backend):
    """With symbolic sizes the overlap is decided per call (the graph runs op by op): raises at each size."""
    compiled = kiln.compile(program, backend=backend, dynamic=True)
    for n in (3, 5):
        args = [torch.linspace(-1.0, 1.0, 4 * n).reshape(n, 4), torch.arange(4 * n).reshape(n, 4)]
        with pytest.raises(RuntimeError) as eager:
            program(*args)
        with pytest.raises(RuntimeError) as compiled_error:
            compiled(*args)
        assert str(compiled_error.value) == str(eager.value)


def expanded_input_written_with_itself(a, d):
    d[...] = d  # the same memory, element for element: eager's copy allows it
    return a * 2


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_fake_kernel_refusing_what_eager_runs_with_dynamic_sizes(backend):
    """With symbolic sizes the fake copy_ refuses the write into the expanded `d` that eager's copy runs (the
    analyze pass raised BackendCompilerFailed to the user on the second size, seed 101337): the graph runs op
    by op instead, and returns what eager returns at each size."""
    compiled = kiln.compile(expanded_input_written_with_itself, backend=backend)
    for n in (3, 4, 5):
        args = [torch.linspace(-1.0, 1.0, 2 * n).reshape(n, 2), torch.arange(3)[:1].expand(3)]
        torch.testing.assert_close(compiled(*args), expanded_input_written_with_itself(*args))


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", RETURNING, ids=lambda f: f.__name__)
def test_returns_what_eager_returns(program, backend):
    eager_args, kiln_args = make(), make()
    torch.testing.assert_close(kiln.compile(program, backend=backend)(*kiln_args), program(*eager_args))
    torch.testing.assert_close(kiln_args, eager_args)


# Backwards that check values: eager's backward of a decomposition into complex vectors raises when the loss
# depends on the vectors' phase, a check the traced backward does not carry.
def eig_vectors_loss(a):
    return torch.linalg.eig(a).eigenvectors.abs().sum() + torch.linalg.eig(a).eigenvectors.real.sum()


def eig_values_loss(a):
    return torch.linalg.eig(a).eigenvalues.abs().sum()


def complex_svd_vectors_loss(a):
    u, s, vh = torch.linalg.svd(torch.complex(a, a.flip(0)))
    return u.real.sum() + s.sum()


def real_svd_vectors_loss(a):
    u, s, vh = torch.linalg.svd(a)
    return (u * 2).sum() + s.sum()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
# torch before 2.13 traces the complex SVD's backward through data-dependent sizes: that graph runs op by op, a
# counted fallback, and still raises eager's error
@pytest.mark.parametrize("program", [eig_vectors_loss, pytest.param(complex_svd_vectors_loss, marks=pytest.mark.
                                     allows_fallback("graph: svd's backward is data-dependent before torch 2.13"))],
                         ids=lambda f: f.__name__)
def test_backward_raises_what_eager_raises(program, backend):
    a = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError) as eager:
        program(a.clone().requires_grad_()).backward()
    with pytest.raises(RuntimeError) as compiled:
        kiln.compile(program, backend=backend)(a.clone().requires_grad_()).backward()
    assert str(eager.value).split(":")[0] in str(compiled.value)


@pytest.mark.parametrize("program", [eig_values_loss, real_svd_vectors_loss], ids=lambda f: f.__name__)
def test_backward_returns_what_eager_returns(program):
    a = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    ref, got = a.clone().requires_grad_(), a.clone().requires_grad_()
    program(ref).backward()
    kiln.compile(program)(got).backward()
    torch.testing.assert_close(got.grad, ref.grad, rtol=1e-4, atol=1e-4)


# Reductions without identity over an empty tensor: eager refuses them (RuntimeError or IndexError, by op), fake
# tensors run several (`max()`, `max(0)`, `mode(0)`) without a check, and an unused one was dead code (seed 101788).
EMPTY_REDUCTIONS_RAISING = {
    "unused_max": lambda a: (a[:0].max(), a * 2)[1],
    "unused_min_of_a_product": lambda a: ((a[:0] * 2).min(), a + 1)[1],
    "max": lambda a: a[:0].max() + 1,
    "max_over_the_empty_dim": lambda a: a[:0].max(0).values * 2,
    "unused_min_over_the_empty_dim": lambda a: (a[:0].min(0), a)[1] * 3,
    "amax_over_the_empty_dim": lambda a: a[:0].amax(0),
    "argmin": lambda a: a[:, :0].argmin(),
    "aminmax": lambda a: torch.aminmax(a[:0])[1],
    "unused_mode": lambda a: (a[:0].mode(0), a.sin())[1],
    "kthvalue": lambda a: a[:0].kthvalue(1, 0).values,
}
EMPTY_REDUCTIONS_RETURNING = {
    "max_over_a_nonempty_dim": lambda a: a[:0].max(1).values + 1,
    "amax_over_a_nonempty_dim": lambda a: a[:0].amax(-1) * 2,
    "median_of_empty": lambda a: a[:0].median(),  # nan, no error
    "unused_argmax_over_a_nonempty_dim": lambda a: (a[:0].argmax(1), a * 2)[1],
}


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", sorted(EMPTY_REDUCTIONS_RAISING))
def test_a_reduction_eager_refuses_over_an_empty_tensor_raises(name, backend):
    program = EMPTY_REDUCTIONS_RAISING[name]
    with pytest.raises(Exception) as eager:
        program(make()[0])
    kiln.reset()
    with pytest.raises(type(eager.value)) as compiled:
        kiln.compile(program, backend=backend, dynamic=False)(make()[0])
    assert str(eager.value).split("\n")[0] in str(compiled.value)


@pytest.mark.sampled(every=2, classes=("name",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", sorted(EMPTY_REDUCTIONS_RETURNING))
def test_a_reduction_eager_runs_over_an_empty_tensor_returns(name, backend):
    program = EMPTY_REDUCTIONS_RETURNING[name]
    kiln.reset()
    torch.testing.assert_close(kiln.compile(program, backend=backend, dynamic=False)(make()[0]), program(make()[0]),
                               equal_nan=True)


# Ops whose eager kernel checks its indices: an unused one is dead code, so its graph runs op by op to raise.
UNUSED_INDEXING = {  # (a: (3, 4), k: an index, out of range at 9) -> a tensor
    "index_select": lambda a, k: (a.index_select(0, torch.tensor([k])), a * 2)[1],
    "gather": lambda a, k: (a.gather(0, torch.tensor([[k, 0, 0, 0]])), a * 2)[1],
    "embedding": lambda a, k: (torch.nn.functional.embedding(torch.tensor([k]), a), a * 2)[1],
    "advanced_index": lambda a, k: (a[torch.tensor([k])], a * 2)[1],
    "cross_entropy_target": lambda a, k: (torch.nn.functional.cross_entropy(a, torch.tensor([k, 0, 0])), a * 2)[1],
    "scatter_add": lambda a, k: (a.scatter_add(0, torch.tensor([[k, 0, 0, 0]]), a[:1]), a * 2)[1],
}


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", sorted(UNUSED_INDEXING))
def test_an_unused_op_with_an_index_out_of_range_raises(name, backend):
    check_raises(lambda a, b: UNUSED_INDEXING[name](a, 9), backend)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", sorted(UNUSED_INDEXING))
def test_an_unused_op_with_indices_in_range_returns(name, backend):
    """The same programs with the index in range: the op-by-op graph returns eager's values."""
    def in_range(a, b):
        return UNUSED_INDEXING[name](a, 1)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(in_range, backend=backend)(*make()), in_range(*make()))
