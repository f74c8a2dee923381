"""A graph input that the graph reads, then writes in place, where eager's backward saved a value computed
from it (`c.float()`), not the input. The partitioner may save the input instead (it is as large, and the
cast fuses into the backward's kernel); the runtime writes the input once the forward ran, so the saved
value must be the one the graph read: eager's backward runs, and so must kiln's, with eager's gradients.
An input written by the caller after the graph is the same class: the partition saves what eager saves rather
than an input eager's backward never reads (partition.py `EXPOSED_COST`). Eager and kiln side by side (values,
gradients, inputs after the call).
"""
import pytest
import torch

import kiln
from support.differential import check


def atan2_of_cast_then_add(b, c):
    t = torch.atan2(b, c.float())
    c.add_(1)
    return t.abs()


def product_with_cast_then_scale(b, c):
    t = (b * c.float()).sin()
    c.mul_(3)
    return t


def divide_by_shifted_then_zero(b, c):
    t = b / (c.float() + 10)
    c.zero_()
    return t.exp()


def ratio_then_transpose_write(b, c):
    t = torch.atan2(c.float(), b)
    c.t_()
    c.add_(2)
    return t


PROGRAMS = [atan2_of_cast_then_add, product_with_cast_then_scale, divide_by_shifted_then_zero,
            ratio_then_transpose_write]


def make(call):
    n = 4 + call
    b = torch.linspace(-1.0, 2.0, n * n).reshape(n, n).requires_grad_()
    return [b, torch.arange(n * n, dtype=torch.int32).reshape(n, n) % 5 - 2]


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_backward_reads_the_value_the_graph_read(program, backend):
    check(program, make, backend, calls=2)


# Written after the graph: an input the caller writes in place between the compiled call and the backward
# (after a graph break, or in a training loop). Eager's backward reads what eager's autograd saved: where that is
# not the input, eager's backward runs, and kiln's partition must not save the input to recompute from (fuzz seed
# 100853): it saves what eager saves. Where eager saves the input itself, both raise autograd's error.

def exp_of_sum(x, w):
    return torch.exp(x + w) * 2  # eager saves the exp


def exp_of_transposed_sum(x, w):
    return torch.exp(x.t() + w[:, None]) * 2  # a view of x shares x's version counter


def sigmoid_of_affine(x, w):
    return torch.sigmoid(2 * x + w) - 1  # eager saves the sigmoid


def tanh_of_scaled_times_weight(x, w):
    return torch.tanh(x * 3) * w  # eager saves the tanh and w


def gelu_of_shift(x, w):
    return torch.nn.functional.gelu(x - w)  # eager saves x - w


def log_of_magnitude(x, w):
    t = x * w
    return torch.log(t.abs() + 1)  # eager saves x (mul's operand): eager's backward raises too


def shifted_magnitude(t1):
    t2 = t1 - 0
    return torch.log(t2.abs() + 1)  # t1 a non-leaf input that requires grad: eager saves t2 and t2.abs() + 1


def run_then_write_the_input(fn, arity: int, n: int):
    """`fn(x, w)` (or `fn(leaf * 2)` for one argument), then `x.add_(1)`, then the backward: the output, and the
    gradient of the leaf, or the backward's error (its type and its message up to eager's hint)."""
    leaf = torch.linspace(-1.0, 1.0, n).requires_grad_()
    if arity == 1:
        x = leaf * 2
        out = fn(x)
    else:
        x = torch.linspace(0.5, 2.0, 2 * n).reshape(2, n)
        out = fn(x, leaf)
    x.add_(1)
    return backward_outcome(out, leaf)


def backward_outcome(out: torch.Tensor, leaf: torch.Tensor):
    """The output, and after the backward of its sum the leaf's gradient, or the backward's error (its type and
    its message up to eager's hint)."""
    try:
        out.sum().backward()
    except RuntimeError as error:
        return out.detach(), (type(error), str(error).split(", which is")[0].split(" is at version")[0])
    return out.detach(), leaf.grad


def assert_side_by_side(run, program, compiled) -> None:
    """`run(fn, n)` for eager's `program` and kiln's `compiled`, on two sizes: the same outputs, and the same
    gradients, or the same error where eager's backward reads the written tensor itself."""
    for n in (5, 6):
        (e_out, e_result), (k_out, k_result) = run(program, n), run(compiled, n)
        torch.testing.assert_close(k_out, e_out)
        if isinstance(e_result, tuple):
            assert k_result == e_result
        else:
            torch.testing.assert_close(k_result, e_result)


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", [exp_of_sum, exp_of_transposed_sum, sigmoid_of_affine,
                                     tanh_of_scaled_times_weight, gelu_of_shift, log_of_magnitude, shifted_magnitude],
                         ids=lambda f: f.__name__)
def test_input_written_after_the_graph(program, backend):
    """Eager and kiln side by side, on two sizes: the same outputs, and the same gradients, or the same error
    where eager's backward reads the written input itself."""
    arity = program.__code__.co_argcount
    assert_side_by_side(lambda fn, n: run_then_write_the_input(fn, arity, n), program,
                        kiln.compile(program, backend=backend))


class ScaledExp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-0.5, 0.5, 4))

    def forward(self, x):
        return torch.exp(x * 0.5 + self.w).sum(-1)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_batch_written_after_a_module_call(backend):
    """A training loop that reuses its input buffer (`x.add_(1)` for the next batch) before the backward."""
    grads = []
    for model in (ScaledExp(), kiln.compile(ScaledExp(), backend=backend)):
        x = torch.linspace(-1.0, 1.0, 12).reshape(3, 4)
        loss = model(x).sum()
        x.add_(1)
        loss.backward()
        grads.append(next(model.parameters()).grad)
    torch.testing.assert_close(grads[1], grads[0])


# A leaf that requires grad (a user's own weight, passed as an argument) is written the same ways: eager refuses
# `w.add_(1)` under grad mode, but not under `no_grad` (`nn.init.zeros_`), nor through a detached alias
# (`w.detach()[:2]`, which shares its version counter; a write into an empty slice of it counts too). Where eager's
# backward does not read the leaf, it runs, and kiln's partition must not have saved the leaf to recompute from
# (fuzz seeds 400100, 402268); where eager saves the leaf itself, both raise autograd's error.

def tanh_of_affine(w):
    return torch.tanh(w * 1.5 + 0.5) * 2  # eager saves the tanh


def exp_times_sigmoid(w):
    t = w * 1.5 + 0.5
    return t.exp() * t.sigmoid()  # eager saves the exp and the sigmoid


def sine_of_leaf(w):
    return torch.sin(w) * 2  # eager saves w: eager's backward raises too


def scaled_under_no_grad(w):
    with torch.no_grad():
        w.mul_(2)


def first_zeroed_by_init(w):
    torch.nn.init.zeros_(w[:1])


def shifted_through_detached_alias(w):
    w.detach()[:2].add_(1)


def empty_slice_written(w):
    w.detach()[:0].add_(1)


def run_then_write_the_leaf(fn, write, n: int):
    """`fn(w)` for a leaf `w` that requires grad, then `write(w)`, then the backward: the output, and the leaf's
    gradient, or the backward's error (its type and its message up to eager's hint)."""
    leaf = torch.linspace(-1.0, 1.0, n).requires_grad_()
    out = fn(leaf)
    write(leaf)
    return backward_outcome(out, leaf)


@pytest.mark.sampled(every=2, classes=("program", "write"))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("write", [scaled_under_no_grad, first_zeroed_by_init, shifted_through_detached_alias,
                                   empty_slice_written], ids=lambda f: f.__name__)
@pytest.mark.parametrize("program", [tanh_of_affine, exp_times_sigmoid, sine_of_leaf], ids=lambda f: f.__name__)
def test_leaf_written_after_the_graph(program, write, backend):
    """Eager and kiln side by side, on two sizes: the same outputs, and the same gradients, or the same error
    where eager's backward reads the written leaf itself."""
    assert_side_by_side(lambda fn, n: run_then_write_the_leaf(fn, write, n), program,
                        kiln.compile(program, backend=backend))


# Written in the graph, then again after it: eager saves the input at the value the graph's own write left
# (`x.zero_()` then `x * w`), so a write by the caller before the backward makes eager's backward raise; kiln's
# runtime writes the input after its forward graph, and its watch starts from the version those writes leave
# (saved_versions.py, `arm_pending`; fuzz seed 451067). Without the caller's write, both backwards run.
def zeroed_then_scaled(x, leaf):
    x.zero_()
    return (x * leaf).exp()


def shifted_then_matmul(x, leaf):
    x.add_(1)
    return torch.tanh(x @ leaf.unsqueeze(-1))


def halved_under_no_grad_then_product(x, leaf):
    with torch.no_grad():
        x.mul_(0.5)
    return (x * leaf).sin()


def run_written_input(fn, n: int, write_after: bool):
    leaf = torch.linspace(-1.0, 1.0, n).requires_grad_()
    x = torch.linspace(0.5, 2.0, 2 * n).reshape(2, n)
    out = fn(x, leaf)
    if write_after:
        x.add_(1)
    return backward_outcome(out, leaf)


@pytest.mark.parametrize("write_after", [True, False], ids=["written after", "not written after"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", [zeroed_then_scaled, shifted_then_matmul, halved_under_no_grad_then_product],
                         ids=lambda f: f.__name__)
def test_input_written_in_the_graph_and_after_it(program, backend, write_after):
    assert_side_by_side(lambda fn, n: run_written_input(fn, n, write_after), program,
                        kiln.compile(program, backend=backend))
