"""An output the caller receives, written in place after the compiled call and before the backward.

Eager's backward reads what eager's autograd saved. Where that is the output (`exp` saves its result, `sin` its
input), a write to it raises autograd's error at the backward, or, through `.data` (which no version counter
sees), changes the gradient. Where eager saved other values (`y.exp() * y.sigmoid()` saves the exp and the sigmoid,
not y), the backward runs as if nothing was written. kiln's partition may save another set of values than eager's:
it must not save an output eager does not save (the write would fail its version check, or change its gradient),
and it must read an output eager saves as returned, not a value recomputed from it before the write
(partition.py `JointLayout.exposed_outputs`, `outputs_saved_by_eager`). Eager and kiln side by side: the outputs
after the write, and the gradients, or the backward's error.
"""
import pytest
import torch

import kiln


def exp_of_product(x, w):
    return (x * w).exp()  # saves its result


def affine_then_gates(x, w):
    y = x * w + 1
    return y, y.exp() * y.sigmoid()  # saves the exp and the sigmoid, not y


def matmul_then_gates(x, w):
    y = x @ w.reshape(x.shape[1], -1)
    return y, y.exp() * y.sigmoid()


def sine_of_returned_product(x, w):
    y = x * w
    return y, y.sin()  # saves y


def view_of_returned_intermediate(x, w):
    t = x * w + 1
    return t[:, :2], t.exp() * t.tanh()  # the view shares t's storage; eager saves the exp and the tanh


def returned_tanh(x, w):
    t = torch.tanh(x * w)
    return t * 3, t  # saves t


def detached_output(x, w):
    y = x * w - 1
    return y.detach(), y.sigmoid() * y.exp()  # the detached output shares y's version counter


def view_of_the_input(x, w):
    return x.t(), (x.detach() + w).exp() * 2  # x's view: no value eager saves


PROGRAMS = {  # program -> which output the caller writes
    exp_of_product: 0, affine_then_gates: 0, matmul_then_gates: 0, sine_of_returned_product: 0,
    view_of_returned_intermediate: 0, returned_tanh: 1, detached_output: 0, view_of_the_input: 0,
}


def in_place(out):
    out.mul_(2)


def under_no_grad(out):
    with torch.no_grad():
        out.mul_(2)


def through_data(out):
    out.data.mul_(2)  # no version counter sees it


WRITES = [in_place, under_no_grad, through_data]


def make(n: int, leaf: bool = True):
    """x requiring grad (a leaf, or a non-leaf computed from one), w not; and the leaf, whose gradient is read."""
    weight = torch.linspace(-1.0, 1.5, 2 * n).reshape(n, 2).requires_grad_()
    x = weight if leaf else weight * 1
    return weight, [x, torch.linspace(0.5, 1.5, 2 * n).reshape(n, 2)]


def write_then_backward(fn, written: int, write, n: int, leaf: bool = True):
    """`fn(x, w)`, `write` into its output `written`, then the backward of every output that requires grad: the
    outputs as written, and the leaf's gradient, or the backward's error (its type, its message up to the
    tensor's description)."""
    weight, args = make(n, leaf)
    outs = fn(*args)
    try:
        write(outs[written])
    except RuntimeError as error:  # eager refuses the write itself (an output that is a leaf's view, say)
        return None, (type(error), str(error))
    values = [o.detach().clone() for o in outs]
    try:
        sum(o.sum() for o in outs if o.requires_grad).backward()
    except RuntimeError as error:
        return values, (type(error), str(error).split(", which is")[0].split(" is at version")[0])
    return values, weight.grad


def assert_same(expected, actual):
    (e_values, e_result), (k_values, k_result) = expected, actual
    torch.testing.assert_close(k_values, e_values)
    assert type(k_result) is type(e_result), f"eager: {e_result}, kiln: {k_result}"  # an error where eager ran
    if isinstance(e_result, tuple):
        assert k_result == e_result
    else:
        torch.testing.assert_close(k_result, e_result)


@pytest.mark.sampled(every=2, classes=("program", "write"))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("write", WRITES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_output_written_before_the_backward(program, write, backend):
    compiled = kiln.compile(program, backend=backend)
    for n in (3, 4):
        assert_same(write_then_backward(program, PROGRAMS[program], write, n),
                    write_then_backward(compiled, PROGRAMS[program], write, n))


class GatedProjection(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        with torch.no_grad():
            self.proj.weight.copy_(torch.linspace(-0.6, 0.6, 16).reshape(4, 4))
            self.proj.bias.copy_(torch.linspace(-0.2, 0.3, 4))

    def forward(self, x):
        y = self.proj(x)
        return y, y.exp() * y.sigmoid()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("write", WRITES, ids=lambda f: f.__name__)
def test_module_output_written_before_the_backward(write, backend):
    """A linear layer's output returned beside the activations eager saves (a graph break after it, or a
    caller that normalizes it in place): the parameters' gradients as eager's."""
    grads = []
    for model in (GatedProjection(), kiln.compile(GatedProjection(), backend=backend)):
        y, z = model(torch.linspace(-1.0, 1.0, 12).reshape(3, 4))
        write(y)
        (y.sum() + z.sum()).backward()
        grads.append([p.grad for p in model.parameters()])
    torch.testing.assert_close(grads[1], grads[0])


# An input that is a leaf at one call and an activation (a non-leaf, which the caller writes) at the next: either
# may be written before the backward (a leaf under no_grad: test_saved_input_written.py), so the partition saves
# neither to recompute from where eager saves values computed from it, and both calls do what eager does.

def scaled_exp(x, w):
    return torch.exp(x * 2) * 3 + w  # eager saves the exp; kiln may save a leaf x and recompute it


def write_input_then_backward(fn, leaf: bool):
    weight, (x, w) = make(4, leaf)
    out = fn(x, w)
    if not leaf:  # an activation, written in place (a buffer reused for the next step)
        x.add_(1)
    try:
        out.sum().backward()
    except RuntimeError as error:
        return out.detach(), (type(error), str(error).split(", which is")[0].split(" is at version")[0])
    return out.detach(), weight.grad


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("leaves", [(True, False), (False, True)], ids=["leaf_first", "non_leaf_first"])
def test_exposure_follows_the_call(leaves, backend):
    compiled = kiln.compile(scaled_exp, backend=backend)
    for leaf in (*leaves, *leaves):
        assert_same(write_input_then_backward(scaled_exp, leaf), write_input_then_backward(compiled, leaf))


# Written through `.data` inside the compiled function: `.data` shares the storage with a version counter of its
# own, so the write is one autograd does not see; a value saved for the backward (t0 for `t0 * t0`) is read with
# what was written, and nothing raises. Captured as `detach()` (which shares the version counter), the trace met
# autograd's error and the graph ran op by op, raising where eager runs (fuzz seed 400015).

def data_write_of_a_saved_factor(a):
    t0 = a * 1.5 + 0.5
    p0 = t0 * t0
    t0.data.mul_(2)
    return t0 + p0


def data_write_after_a_break(a):
    t0 = a * 1.5 + 0.5
    p0 = t0.exp() * t0
    kiln.graph_break()
    t0.data.add_(1)
    return t0 + p0


@pytest.mark.sampled(every=3, classes=("program",))
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("program", [data_write_of_a_saved_factor, data_write_after_a_break], ids=lambda f: f.__name__)
def test_data_write_inside_the_function(program, backend):
    compiled = kiln.compile(program, backend=backend)
    results = []
    for fn in (program, compiled):
        a = torch.linspace(-1.0, 1.0, 6).requires_grad_()
        out = fn(a)
        out.sum().backward()
        results.append((out.detach(), a.grad))
    torch.testing.assert_close(results[1], results[0])


# Written, and not reached: eager raises only where a gradient reaches the node that saved the written value. A
# compiled graph has one backward node for all its outputs, so its saved values are checked by kiln's watch of what
# eager saves (saved_versions.py), not by autograd's check of each saved value, which would raise at any backward
# through the graph (fuzz seed 400027).

def product_and_double(x, w):
    return x * w, w * 2  # saves x, for the gradient of w through the product


def chain_with_a_square(x, w):
    t0 = w * 1.5 + 0.5
    t1 = t0 * 1.5 + 0.5
    return t0, t1, t1 * t1  # saves t1, which the caller writes


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program, written", [(product_and_double, "input"), (chain_with_a_square, "output")],
                         ids=["input", "output"])
def test_written_and_not_reached(program, written, backend):
    compiled = kiln.compile(program, backend=backend)
    for loss_from in range(len(program(*make(2)[1]))):  # each output: whether its backward reaches the saver or not
        results = []
        for fn in (program, compiled):
            weight, (x, w) = make(3)
            outs = fn(x.detach(), weight)
            with torch.no_grad():
                (x if written == "input" else outs[1]).add_(1)
            try:
                outs[loss_from].sum().backward()
                results.append(weight.grad)
            except RuntimeError as error:
                results.append((type(error), str(error).split(", which is")[0].split(" is at version")[0]))
        assert type(results[1]) is type(results[0]), results
        if isinstance(results[0], tuple):
            assert results[1] == results[0]
        else:
            torch.testing.assert_close(results[1], results[0])


def batched_matmul(c):
    t = c * 1.5 + 0.5
    return t @ t.mT  # a view of the 3-d product's buffer in the compiled graph; eager's is no view


@pytest.mark.sampled(every=2, classes=("write",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("write", WRITES, ids=lambda f: f.__name__)
def test_view_of_a_buffer_written(write, backend):
    """An output the compiled graph returns as a view of its own buffer: autograd took it for one of several
    views returned by one function, which it refuses to let be written in place (fuzz seed 400016)."""
    compiled = kiln.compile(batched_matmul, backend=backend)
    results = []
    for fn in (batched_matmul, compiled):
        c = torch.linspace(-1.0, 1.0, 54).reshape(2, 3, 3, 3).requires_grad_()
        out = fn(c)
        write(out)
        out.sum().backward()
        results.append((out.detach(), c.grad))
    torch.testing.assert_close(results[1], results[0])
