"""A backward through one output of a compiled graph frees only what that output's backward reads.

Eager has a node per op: `loss.backward()` frees the saved tensors of the nodes it ran, and a later backward
through an output computed beside the loss still finds its own. A compiled graph is one autograd node; where the
outputs' backwards read different saved tensors (kiln/autograd/saved_parts.py), a later backward through another
output runs as eager's does, and a second backward through the same part raises eager's error. Found by the fuzzer
(seed 210205: a module writing its running statistics called for both outputs, so the graph stays one node).
"""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.autograd.saved_parts import saved_parts

BACKENDS = ["aot_eager", "inductor"]


class Statistics(torch.nn.Module):
    """A linear map that updates a running mean in place, like BatchNorm's: two calls of it in one graph read and
    write the same buffer, so the graph cannot be split into a node per output."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(-0.5, 0.5, 9).reshape(3, 3))
        self.register_buffer("running", torch.zeros(3))

    def forward(self, x):
        y = x @ self.weight
        self.running.mul_(0.9).add_(y.detach().mean(0), alpha=0.1)
        return y - self.running


def loss_beside_a_module_output(a, model):
    kept = model(a)
    loss = model(a.var(0).reshape(1, 3)).square().mean()
    loss.backward()
    return kept


def loss_beside_a_shared_sum(a, model):
    shared = a + 1  # the two gradients meet at the add's backward, which reads no saved tensor
    loss = (shared.sin() * model.weight.sum()).sum()
    loss.backward()
    return shared * 3


def run(fn, program, retain=False):
    """The program's output, then a backward through it: the output, the gradients and the buffers."""
    model = Statistics()
    a = torch.linspace(-1.0, 1.0, 12).reshape(4, 3).requires_grad_(True)
    out = fn(a, model)
    out.sum().backward()
    return out, a.grad, model.weight.grad, model.running


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", [loss_beside_a_module_output, loss_beside_a_shared_sum],
                         ids=lambda f: f.__name__)
def test_a_backward_through_an_output_after_the_loss_backward_gives_eagers_gradients(program, backend):
    torch.testing.assert_close(run(kiln.compile(program, backend=backend), program), run(program, program))


def two_outputs(a, w):
    return (a @ w).tanh(), (a.exp() * w.sum()).sin()


def two_outputs_of_one_sum(a, w):
    h = a + 1  # computed once for both outputs: the graph is one part; its backward only passes gradients
    return (h @ w).tanh(), (h.exp() * w.sum()).sin()


def backward_through(outs, which, retain=False):
    outs[which].sum().backward(retain_graph=retain)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_backward_through_the_same_output_raises_as_eager(backend):
    for fn in (two_outputs, kiln.compile(two_outputs, backend=backend)):
        a, w = torch.randn(2, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
        outs = fn(a, w)
        backward_through(outs, 0)
        backward_through(outs, 1)  # the other output's backward reads other saved tensors
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            backward_through(outs, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_retain_graph_keeps_a_part_for_another_backward(backend):
    def gradients(fn):
        torch.manual_seed(0)
        a, w = torch.randn(2, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
        outs = fn(a, w)
        backward_through(outs, 0, retain=True)
        backward_through(outs, 1)
        backward_through(outs, 0)  # retained by the first backward, not freed by the second
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            backward_through(outs, 0)
        return a.grad, w.grad

    torch.testing.assert_close(gradients(kiln.compile(two_outputs, backend=backend)), gradients(two_outputs))


def outputs_meeting_at_a_saved_value(a):
    shared = a.sin()  # both outputs' gradients meet at sin's backward, which reads a
    return shared.sum(), shared * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_meeting_where_a_saved_tensor_is_read_raise_as_eager(backend):
    for fn in (outputs_meeting_at_a_saved_value, kiln.compile(outputs_meeting_at_a_saved_value, backend=backend)):
        loss, kept = fn(torch.linspace(-1.0, 1.0, 6).requires_grad_(True))
        loss.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            kept.sum().backward()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_saved_input_written_before_the_later_backward_raises_as_eager(backend):
    """The later backward reads this call's own references to the saved tensors (autograd freed its copies at the
    first backward), and checks their versions as autograd does."""
    for fn in (two_outputs, kiln.compile(two_outputs, backend=backend)):
        a, w = torch.randn(2, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
        outs = fn(a, w)
        backward_through(outs, 1)
        with torch.no_grad():
            a.mul_(2)  # the first output's backward reads a
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            backward_through(outs, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_parts_a_backward_ran_are_freed(backend):
    """What only the first output's backward reads is freed by it, as eager frees its nodes' saved tensors; the
    rest is held for the other output."""
    a, w = torch.randn(2, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    first, second = kiln.compile(two_outputs_of_one_sum, backend=backend)(a, w)
    held = first.grad_fn.held
    first.sum().backward()
    kept = [t for t in held.tensors if isinstance(t, torch.Tensor)]
    assert 0 < len(kept) < len(held.tensors)
    second.sum().backward()
    assert not any(isinstance(t, torch.Tensor) for t in held.tensors)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_history_of_an_input_only_another_output_reaches_is_kept(backend):
    """Eager's backward through `a.sin()` never runs `w.exp()`'s node. The outputs share no computation, so each
    is a graph and a backward node of its own (kiln/autograd/graph_parts.py), with edges to its own inputs only:
    one node for both would hand `b` None, which runs `w.exp()`'s node and frees the result it saved, and the
    later backward through `a * b` would raise where eager's runs."""
    def run(fn):
        a, w = torch.randn(2, 3, requires_grad=True), torch.randn(2, 3, requires_grad=True)
        first_out, second_out = fn(a, w.exp())
        first_out.sum().backward()
        second_out.sum().backward()
        return a.grad, w.grad

    torch.manual_seed(0)
    expected = run(lambda a, b: (a.sin(), a * b))
    torch.manual_seed(0)
    torch.testing.assert_close(run(kiln.compile(lambda a, b: (a.sin(), a * b), backend=backend)), expected)


def test_parts_join_where_an_op_reading_a_saved_tensor_takes_several_gradients():
    """In a backward graph (placeholders: saved values, then tangents), the sum of two outputs' contributions joins
    nothing; an op that reads a saved tensor (here through `cos`, which reads no gradient) and depends on two
    tangents joins them, as eager's node where their gradients meet."""
    def apart(a, b, t0, t1):
        return t0 * a.cos() + t1 * b, t1 * 2

    def joined(a, b, t0, t1):
        return (t0 + t1) * a.cos(), t1 * b

    def aten_graph(fn):
        return make_fx(fn)(*(torch.randn(3) for _ in range(4)))

    parts = saved_parts(aten_graph(apart), [False, False], 2)
    assert parts.part_of[0] != parts.part_of[1]
    assert parts.readers == (frozenset({parts.part_of[0]}), frozenset({parts.part_of[1]}))
    assert saved_parts(aten_graph(joined), [False, False], 2) is None


def test_parts_join_where_an_op_whose_eager_node_saves_a_scalar_takes_several_gradients():
    """`(t0 + t1) * 2` is `a * 2`'s backward where two outputs' gradients meet: eager's node saved the 2 and a
    second backward through it raises, so the outputs are one part though no saved tensor is read."""
    def scaled_sum(a, t0, t1):
        return (t0 + t1) * 2, t1 * a

    graph = make_fx(scaled_sum)(*(torch.randn(3) for _ in range(3)))
    assert saved_parts(graph, [False], 2) is None


def an_input_written_after_a_graph_break(c):
    kept = c.amax(0)  # amax's backward reads c
    out = c * 1.5 + 0.5  # its backward reads nothing saved
    kiln.graph_break()
    c.neg_()
    return out, kept


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_saved_tensor_written_since_is_not_checked_by_a_backward_that_skips_its_readers(backend):
    """Eager never runs amax's node when the loss skips its output, so the write to what it saved raises nothing;
    a backward through the compiled graph's one node checks only what the parts it runs read (fuzz seed 401265)."""
    grads = []
    for fn in (an_input_written_after_a_graph_break,
               kiln.compile(an_input_written_after_a_graph_break, backend=backend)):
        leaf = torch.linspace(-1.0, 1.0, 3).requires_grad_(True)
        out, kept = fn(leaf * 1)
        out.sum().backward()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            kept.sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[1], grads[0])
