"""`loss.backward()` inside the compiled function, then a backward through another output of the same graph.

A compiled graph is one backward node for all its outputs (an autograd.Function); eager has a node per op. The
first backward (through the loss) frees the node's saved tensors, so a later backward through another output of
the graph found them gone, where eager's own nodes of that output still hold theirs; torch.compile raises
"backward through the graph a second time" on these programs (measured in `test_torch_compile_raises_too`). kiln
compiles a graph that ends at the user's `backward()` as one backward node per part that shares no computation
with the others (kiln/autograd/graph_parts.py), so the later backward gives eager's gradients. Found by the fuzzer
(seed 100489).

Parts that share computation stay one node, and so do parts that meet through a tensor one writes and another
reads, or that both draw random numbers: split, they could run in another order than eager's. That node frees per
part of its backward what the first backward read (test_saved_parts.py): where the outputs' gradients meet at an op
reading a saved value, eager raises at the later backward, and kiln raises autograd's error with a note naming the
graph, the user's backward() line and the way out (retain_graph=True).
"""
import pytest
import torch

import kiln
from kiln.autograd.graph_parts import independent_parts

BACKENDS = ["aot_eager", "inductor"]


def output_computed_before_the_backward(a):
    kept = a * 2
    loss = a.sin().sum()
    loss.backward()
    return kept * 3


def module_loss_beside_a_kept_activation(a, model):
    kept = a.exp()
    loss = model(a).square().mean()
    loss.backward()
    return kept.tanh()


def two_kept_outputs(a):
    first, second = a.exp(), a * a
    loss = a.sin().sum()
    loss.backward()
    return first + second.sin()


def kept_under_no_grad_beside_one_with_grad(a):
    kept = a.exp()
    with torch.no_grad():
        scale = a.abs().max()
    loss = (a * a).sum()
    loss.backward()
    return kept * scale


def batch_norm_loss_beside_a_kept_activation(a, model):
    kept = a.mean(-1)  # the model's running statistics are written by the loss's part only
    loss = model(a).square().mean()
    loss.backward()
    return kept.flip(0)


PROGRAMS = [output_computed_before_the_backward, module_loss_beside_a_kept_activation, two_kept_outputs,
            kept_under_no_grad_beside_one_with_grad, batch_norm_loss_beside_a_kept_activation]


def model_of(program):
    torch.manual_seed(0)
    if program is module_loss_beside_a_kept_activation:
        return (torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)),)
    if program is batch_norm_loss_beside_a_kept_activation:
        return (torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1)),)
    return ()


def run(fn, program):
    a = torch.linspace(-1.0, 1.0, 6).reshape(2, 3).requires_grad_(True)
    models = model_of(program)
    out = fn(a, *models)
    out.sum().backward()
    return out, a.grad, [b.clone() for m in models for b in m.buffers()]


@pytest.mark.parametrize("program", PROGRAMS[:3], ids=lambda f: f.__name__)
def test_torch_compile_raises_too(program):
    """The reference: torch.compile's graph is one backward node, and the second backward raises."""
    torch._dynamo.reset()
    run(program, program)  # eager runs it
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        run(torch.compile(program, backend="aot_eager"), program)


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_independent_parts_give_eagers_outputs_and_gradients(program, backend, dynamic):
    expected = run(program, program)
    torch.testing.assert_close(run(kiln.compile(program, backend=backend, dynamic=dynamic), program), expected)


def shared_sum(a):
    shared = a + 1  # eager's add saves nothing: the later backward through `kept` runs in eager
    loss = shared.sin().sum()
    loss.backward()
    return shared * 3


def random_part(a):
    kept = torch.nn.functional.dropout(a, 0.5)
    loss = a.sin().sum()
    loss.backward()
    return kept


def random_parts(a):
    kept = torch.nn.functional.dropout(a, 0.5)
    loss = torch.nn.functional.dropout(a.sin(), 0.5).sum()
    loss.backward()
    return kept


def written_part(a, b):
    kept = a.exp()
    b.add_(1)
    loss = a.sin().sum()
    loss.backward()
    return kept


def read_before_written_elsewhere(a, b):
    kept = a.exp() + b  # reads b before the write: its part runs first, done before the write
    b.add_(1)  # no output reads the write's result: it runs in the part of b's next reader
    loss = (a * b).sum()
    loss.backward()
    return kept


def written_then_read_elsewhere(a, b):
    b.add_(1)
    kept = a.exp() + b  # reads b after the write
    loss = (a * b).sum()
    loss.backward()
    return kept


def read_after_a_part_wrote(a, b):
    doubled = a * 2
    # the write's operand does not require grad: the loss's part hands it over, and the kept output's part,
    # which reads b, writes it first
    b.add_(doubled.detach().sum())
    kept = a.exp() + b
    loss = doubled.sum()
    loss.backward()
    return kept


def running_statistics_read_then_updated(a, b):
    kept = a * a.sum().detach() + b.mean()  # BatchNorm-like statistics read, then updated by the loss's part
    b.mul_(0.9)
    b.add_(a.detach().mean(0), alpha=0.1)
    loss = (a - b).square().mean()
    loss.backward()
    return kept


READ_AND_WRITTEN = [read_before_written_elsewhere, written_then_read_elsewhere, read_after_a_part_wrote,
                    running_statistics_read_then_updated]


def captured_graph(program, *args):
    graphs = []

    def keep(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    kiln.compile(program, backend=keep)(*args)
    return graphs[0]


@pytest.mark.parametrize("program, parts", [
    (output_computed_before_the_backward, 2), (two_kept_outputs, 3), (random_part, 2), (written_part, 2),
    (shared_sum, None), (random_parts, None), (read_before_written_elsewhere, 2), (written_then_read_elsewhere, None),
    (read_after_a_part_wrote, 2), (running_statistics_read_then_updated, 2)],
    ids=lambda p: getattr(p, "__name__", str(p)))
def test_which_graphs_split(program, parts):
    """Parts sharing computation, both drawing random numbers, or one reading a tensor another writes, unless the
    reading part runs first and is done before the write, keep the graph whole; a write or a draw in one part
    alone is that part's."""
    written = program in [written_part] + READ_AND_WRITTEN
    args = [torch.ones(2, 3, requires_grad=True)] + ([torch.zeros(3)] if written else [])
    gm, example_inputs = captured_graph(program, *args)
    assert gm.meta.get("kiln.ends_at_backward")
    split = independent_parts(gm, example_inputs)
    assert (None if split is None else len(split.parts)) == parts


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_written_tensor_and_random_draws_stay_eagers(backend):
    """A part's write and a part's draws, split from the rest, leave what eager leaves: the buffer written, the
    dropout mask eager's for the seed (aot_eager runs eager's ops in eager's order)."""
    def run_written(fn):
        a, b = torch.ones(2, 3, requires_grad=True), torch.zeros(3)
        out = fn(a, b)
        out.sum().backward()
        return out, a.grad, b

    torch.testing.assert_close(run_written(kiln.compile(written_part, backend=backend)), run_written(written_part))
    if backend == "aot_eager":
        def run_random(fn):
            torch.manual_seed(1)
            a = torch.ones(4, 5, requires_grad=True)
            out = fn(a)
            out.sum().backward()
            return out, a.grad

        torch.testing.assert_close(run_random(kiln.compile(random_part, backend=backend)), run_random(random_part))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", [read_before_written_elsewhere, running_statistics_read_then_updated],
                         ids=lambda p: p.__name__)
def test_a_tensor_read_and_written_by_two_parts_leaves_what_eager_leaves(program, backend):
    """Split where a part reads a tensor before another part writes it: the outputs, the gradients after the
    later backward and the written tensor equal eager's (the reading part ran first). The programs that stay
    whole raise at the later backward, as under torch.compile (test_parts_sharing_computation_raise...)."""
    def run(fn):
        a, b = torch.linspace(-1, 1, 6).reshape(2, 3).requires_grad_(), torch.full((3,), 0.5)
        out = fn(a, b)
        out.sum().backward()
        return out, a.grad, b

    torch.testing.assert_close(run(kiln.compile(program, backend=backend)), run(program))


def unused_draw(a):
    torch.rand(2)  # no value is read, but the generator moves on
    kept = a.exp()
    loss = a.sin().sum()
    loss.backward()
    return kept


def test_an_unused_draw_runs_in_one_part():
    """A call that takes no values and returns none is copied into every part when it switches a mode; one that
    draws random numbers goes into one part only, or the generator would move once per part."""
    gm, example_inputs = captured_graph(unused_draw, torch.ones(2, 3, requires_grad=True))
    split = independent_parts(gm, example_inputs)
    assert [part.gm.code.count("torch.rand(") for part in split.parts] in ([1, 0], [0, 1])


def shared_sine(a):
    shared = a.sin()  # both outputs' gradients meet at sin's backward, which reads a
    loss = shared.sum()
    loss.backward()
    return shared * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_parts_sharing_computation_give_eagers_gradients(backend):
    """The outputs' gradients meet at the add's backward, which reads nothing saved: the later backward runs."""
    torch.testing.assert_close(run(kiln.compile(shared_sum, backend=backend), shared_sum), run(shared_sum, shared_sum))


@pytest.mark.parametrize("backend", BACKENDS)
def test_parts_meeting_at_a_saved_value_raise_naming_the_graph_and_the_backward_line(backend):
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        run(shared_sine, shared_sine)  # eager's sin node was freed by loss.backward()
    with pytest.raises(RuntimeError) as raised:
        run(kiln.compile(shared_sine, backend=backend), shared_sine)
    message = str(raised.value)
    assert "backward through the graph a second time" in message  # autograd's own words come first
    assert "compiled graph of shared_sine" in message
    assert "loss.backward()" in message  # the user's line that freed the graph's saved tensors
    assert "retain_graph=True" in message


def retaining(a):
    kept = a * 2
    loss = a.sin().sum()
    loss.backward(retain_graph=True)
    return kept * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_retain_graph_on_the_first_backward_gives_eagers_gradients(backend):
    torch.testing.assert_close(run(kiln.compile(retaining, backend=backend), retaining), run(retaining, retaining))


def backward_twice(a):
    return a.sin().sum() * 2, a.cos()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_real_second_backward_raises_as_eager_does(backend):
    """A loss run backward twice raises autograd's error under kiln as in eager, from one output or several."""
    for fn in (backward_twice, lambda a: a.sin().sum()):
        for call in (fn, kiln.compile(fn, backend=backend)):
            a = torch.linspace(-1.0, 1.0, 6).requires_grad_(True)
            out = call(a)
            loss = out[0] if isinstance(out, tuple) else out
            loss.backward()
            with pytest.raises(RuntimeError, match="backward through the graph a second time"):
                loss.backward()


def outputs_of_different_inputs(a, b):
    return a.sin(), a * b


def outputs_of_the_same_inputs(a, b):
    return (a * b).sin(), a + b


def outputs_beside_a_dead_op(a, b):
    b[b.long()]  # nothing reads it; eager raises where an index is out of range (as fuzz seed 169, a bool - 1)
    return a.sin(), a * b


@pytest.mark.parametrize("program, parts", [(outputs_of_different_inputs, 2), (outputs_of_the_same_inputs, None),
                                            (outputs_beside_a_dead_op, None)],
                         ids=lambda p: getattr(p, "__name__", str(p)))
def test_a_graph_splits_where_its_outputs_have_different_edges(program, parts):
    """Outside a backward() a graph splits only where its parts' differentiable outputs are computed from
    different inputs that require grad, and every op of it is in a part: a dead op keeps the graph whole, where
    the check of what eager raises sees it."""
    gm, example_inputs = captured_graph(program, torch.ones(2, 3, requires_grad=True),
                                        torch.ones(2, 3, requires_grad=True))
    split = independent_parts(gm, example_inputs, where_edges_differ=True)
    assert (None if split is None else len(split.parts)) == parts


def written_input_beside_an_output(t5, t0):
    t5.mul_(2)  # new history for t5: one more "output" of the graph's backward node
    return (t0 * 2).exp() * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_written_beside_an_output_of_other_inputs_is_a_part_of_its_own(backend):
    """A backward through the output never reaches t5's history (fuzz seed 420108): there `t3 * t3` saved t3, which
    was written since, and running that node raises. One node for the write and the output had an edge to both."""
    grads = []
    for fn in (written_input_beside_an_output, kiln.compile(written_input_beside_an_output, backend=backend)):
        a = torch.linspace(-1.0, 1.0, 6).reshape(3, 2).requires_grad_()
        t3 = a * 1.5 + 0.5
        p3 = t3 * t3
        t3.mul_(2)
        t5, t0 = (t3 + p3) * 1.5, a * 0.5
        fn(t5, t0).sum().backward()
        grads.append(a.grad)
    torch.testing.assert_close(grads[1], grads[0])


def relu_written_then_unused(b, d):
    t0 = b * 1.5 + 0.5
    t1 = torch.relu(d)  # saves its result
    t1[:0].add_(1)  # an empty write counts as a write: relu's backward would raise
    t3 = t1 * 1.5 + 0.5
    p3 = t3 * t3
    kiln.graph_break()
    t3 = t3 + p3
    t5 = t0 * 1.5 + 0.5
    kiln.graph_break()
    return t5


def test_a_backward_through_one_output_does_not_walk_into_another_parts_history():
    """The graph after the first break returns `t3 + p3` (a local, dead) and `t5`, computed from other inputs: each
    is a backward node of its own, and the backward through `t5` never runs relu's node, whose saved result an
    empty write changed (fuzz seed 412468: it raised in kiln's backward, not in eager's)."""
    grads = []
    for fn in (relu_written_then_unused, kiln.compile(relu_written_then_unused, backend="aot_eager")):
        b = torch.linspace(-1.0, 1.0, 6).reshape(2, 3).requires_grad_()
        d = torch.linspace(-1.0, 1.0, 6).reshape(2, 3).requires_grad_()
        fn(b, d).sum().backward()
        grads.append((b.grad, d.grad))
    torch.testing.assert_close(grads[1], grads[0])


def two_inputs_written(t0, t4):
    t0[..., t0.shape[-1]:] = 0  # an empty write is a write: t0's new history is CopySlices over prod's node
    t4.zero_()


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_written_by_a_graph_returning_nothing_are_parts_of_their_own(backend):
    """A graph whose only effects are writes into two inputs that require grad gives each its own node: a backward
    through t4 never reaches prod's node under t0, whose saved result the write changed (fuzz seed 441656: one node
    for both writes had an edge to t0's history, and the engine ran prod's node, which raised)."""
    grads = []
    for fn in (two_inputs_written, kiln.compile(two_inputs_written, backend=backend)):
        a = torch.linspace(-1.0, 1.0, 6).reshape(2, 3).requires_grad_()
        t0, t4 = a.prod(1), a * 1.5
        fn(t0, t4)
        t4.sum().backward()
        grads.append(a.grad)
    torch.testing.assert_close(grads[1], grads[0])


def write_then_read_beside_other_inputs(t3, p3, b, through_detach):
    (t3.detach() if through_detach else t3)[..., :1].zero_()
    t3 = t3 + p3  # reads the written input: the write runs in this output's part
    return t3, b * 1.5


@pytest.mark.parametrize("through_detach", [True, False], ids=["through_detach", "in_place"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_write_read_later_runs_in_the_readers_part(backend, through_detach):
    """A write into t3 that a later op of the graph reads belongs to that op's part, and the part of `b` stays a
    node of its own: a backward through it never reaches t3's history, where relu's saved result was written
    since (fuzz seed 412468: the write was a part of its own, which the reading part met, so the graph stayed one
    node and the backward raised)."""
    grads = []
    for fn in (write_then_read_beside_other_inputs,
               kiln.compile(write_then_read_beside_other_inputs, backend=backend)):
        d = torch.linspace(-1.0, 1.0, 6).reshape(2, 3).requires_grad_()
        b = torch.linspace(-1.0, 1.0, 6).reshape(2, 3).requires_grad_()
        t1 = torch.relu(d)
        t1[:0].add_(1)  # an empty write bumps the version relu's node saved
        t3 = t1 * 1.5 + 0.5
        out, other = fn(t3, t3 * t3, b, through_detach)
        other.sum().backward()
        grads.append(b.grad)
    torch.testing.assert_close(grads[1], grads[0])


def write_beside_a_loss(t2, a, model):
    t2.add_(1)  # t2's new history comes from this graph, which ends at the user's backward
    loss = model(a).square().mean()
    loss.backward()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_write_beside_a_loss_is_a_node_of_its_own(backend):
    """A graph ending at `loss.backward()` that also writes into an input that requires grad (a value of an earlier
    graph): one node for both had an edge to that input's history, so the loss's backward ran (and freed) it, and a
    later backward through the written input raised "backward through the graph a second time" where eager's
    runs (fuzz seed 457701). The write is a part of its own, as in a graph not ending at a backward."""
    results = []
    for fn in (write_beside_a_loss, kiln.compile(write_beside_a_loss, backend=backend)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
        a = torch.linspace(-1.0, 1.0, 12).reshape(4, 3).requires_grad_()
        t1 = a @ a.mT
        t2 = (t1 * 2 + t1.exp()).unsqueeze(-2)
        fn(t2, a, model)
        t2.sum().backward()
        results.append((a.grad, [p.grad for p in model.parameters()], list(model.buffers())))
    torch.testing.assert_close(results[1], results[0])


def loss_of_an_activations_bits(t2, p2, model):
    t2 = t2 + p2
    bits = (t2 * 2049).view(torch.int16)  # no gradient flows through the bits: the loss meets t2 only here
    loss = model(bits.float().reshape(-1, 3)).square().mean()
    loss.backward()
    return t2, bits


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_parts_meeting_only_through_a_value_without_grad_hand_it_over(backend, dynamic):
    """The loss reads `t2` only through its int16 bits, which carry no gradient: eager's backward through the loss
    never reaches t2's history, and a later backward through t2 runs. kiln's graph was one node, freed by the loss's
    backward, and the later backward raised (fuzz seed 470642). The part computing t2 hands the bits to the loss's
    part, and each is a node of its own."""
    results = []
    for fn in (loss_of_an_activations_bits,
               kiln.compile(loss_of_an_activations_bits, backend=backend, dynamic=dynamic)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
        a = torch.linspace(-1.0, 1.0, 12).reshape(4, 3).requires_grad_()
        t2, bits = fn((a * 1.5).bfloat16(), (a * 3).exp().bfloat16(), model)
        (t2.float() * 3).sum().backward()
        results.append((t2, bits, a.grad, [p.grad for p in model.parameters()], list(model.buffers())))
    torch.testing.assert_close(results[1], results[0])


def test_which_graphs_hand_values_over():
    """Only where nothing else splits the graph: a mask shared by two outputs' parts is handed over, and a graph
    whose outputs share a differentiable value stays whole."""
    def masked_pair(a, b):
        mask = a > 0
        return a * mask, b.exp() * mask

    def shared(a, b):
        s = a * b
        return s.sin(), s.cos()

    a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    split = independent_parts(*captured_graph(masked_pair, a, b), where_edges_differ=True)
    assert split is not None and [len(p.handed_out) for p in split.parts] == [1, 0]
    assert independent_parts(*captured_graph(shared, a, b), where_edges_differ=True) is None


def detached_after_an_in_place_write(a, linear):
    t0 = a * 2
    t0.mul_(3)
    return t0, linear(t0.detach() + 1)


def a_view_written_then_read_detached(a, linear):
    t0 = a.sin()
    t0[1:].add_(1)
    return t0, linear(t0.detach())


def a_negated_view_written_then_read_detached(a, linear):
    t0 = (-a)._neg_view()
    t0[0].zero_()
    t3 = (-(t0.detach() * 2))._neg_view()
    return t0, linear(t3), t3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", [detached_after_an_in_place_write, a_view_written_then_read_detached,
                                     a_negated_view_written_then_read_detached], ids=lambda f: f.__name__)
def test_a_part_reading_a_tensor_another_part_writes_reads_the_written_value(program, backend):
    """An intermediate written in place, returned, and read detached by a module: the split made the module's part
    compute the intermediate again from the inputs, without the write, and return values from before it, silently
    (fuzz seed 600639). A tensor one part writes is computed by no other part: the graph stays whole."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(3, 3)
    a = torch.randn(4, 3, requires_grad=True)
    want = program(a, linear)
    got = kiln.compile(program, backend=backend)(a, linear)
    torch.testing.assert_close(got, want)
    assert independent_parts(*captured_graph(program, a, linear)) is None
