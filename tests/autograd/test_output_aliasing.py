"""Outputs that alias each other or the inputs come back as eager returns them (issue 21, class 2).

Each program runs eagerly and compiled (`differential.check`): values, shapes, strides, which
outputs share storage with which (so a write through one is seen through the others), and each
output's requires_grad / is_leaf / grad_fn, then the inputs' gradients.
"""
import pytest
import torch

import kiln
from kiln.autograd.aot import aot_compile, run_graph
from kiln.autograd.signature import FlatProgram
from support.differential import check


def detached_twin(x):
    y = x * 2
    return y, y.detach()


def strided_views(x):
    t = x + 1
    p = t[::2]
    q = t[1:]
    return p, q[:2]


def views_of_views(x):
    t = x * 3
    return t[1:][::2], t[2:], t


def view_before_base(x):
    y = x.sin()
    return y.view(2, 4).t(), y


def same_twice(x):
    y = x + 1
    return y, y


def unbind_intermediate(x):
    return (x.view(2, 4) * 2).unbind(0)


def split_with_base(x):
    y = x * 2
    return y.split(3), y


def chunk_intermediate(x):
    return (x - 1).chunk(3)


def expanded_and_diagonal(x):
    y = x.view(2, 4) + 1
    return y[:, :2].diagonal(), y[0].expand(3, 4), y


def detached_slice(x):
    y = x * 2
    return y[1:].detach(), y


def identity(x):
    return x


def input_views(x):
    return x.view(-1), x[0], x.view(2, 4).t(), x[1:], x[:2]


def input_detached(x):
    return x.detach(), x * 2


def input_unbind(x):
    return x.view(4, 2).unbind(1)


def under_no_grad(x):
    with torch.no_grad():
        y = x * 2
        v = x[1:]
    return x * 3, y, v


def integer_outputs(x):
    return x.argmax(), (x > 0), x.sum()


def mixed(x):
    t = x + 1
    return x, t, x[2:], t[1:], t.detach(), 5


PROGRAMS = [detached_twin, strided_views, views_of_views, view_before_base, same_twice, unbind_intermediate,
            split_with_base, chunk_intermediate, expanded_and_diagonal, detached_slice, identity, input_views,
            input_detached, input_unbind, under_no_grad, integer_outputs, mixed]


def _vector(requires_grad: bool, n: int = 8):
    def make(call):
        return (torch.linspace(-1.0, 2.0, n + 0 * call, dtype=torch.float32).requires_grad_(requires_grad),)
    return make


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_aliased_outputs_aot_eager(program, requires_grad):
    check(program, _vector(requires_grad), "aot_eager", calls=2)


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("program", [detached_twin, strided_views, views_of_views, view_before_base, split_with_base,
                                     expanded_and_diagonal, input_views, mixed], ids=lambda f: f.__name__)
def test_aliased_outputs_inductor(program, requires_grad):
    check(program, _vector(requires_grad), "inductor", calls=2)


def dynamic_views(x):
    t = x * 2
    half = x.shape[0] // 2
    return t[:half], t[half:], t.view(2, -1).t(), x[1:], x.view(-1, 2)[0], t.detach(), t


def dynamic_detach(x):
    y = x + 1
    return y, y.detach(), x.detach(), x


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("dynamic", [None, True], ids=["auto_dynamic", "dynamic"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", [dynamic_views, dynamic_detach, strided_views, mixed], ids=lambda f: f.__name__)
def test_aliased_outputs_with_changing_sizes(program, backend, dynamic):
    """The views' geometry follows each call's sizes, never the first call's."""
    def make(call):
        return (torch.linspace(-1.0, 2.0, 8 + 4 * call).requires_grad_(call % 2 == 1),)
    check(program, make, backend, dynamic=dynamic, calls=4)


def test_views_of_inputs_at_another_storage_offset():
    """`buf[1:5]` and `buf[3:7]` pass the same tensor guard: a view of the input starts at the input's offset."""
    def make(call):
        buf = torch.arange(10.0)
        return (buf[1 + 2 * call:5 + 2 * call],)
    for backend in ("aot_eager", "inductor"):
        check(input_views_1d, make, backend, calls=3)


def input_views_1d(x):
    return x[1:], x[::2], x.detach(), x + 1


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", [detached_twin, input_views, input_detached, under_no_grad, mixed, identity,
                                     integer_outputs], ids=lambda f: f.__name__)
def test_aliased_outputs_of_a_call_under_no_grad(program, backend):
    """Called under no_grad with inputs that require grad: the flags eager gives each output."""
    check(program, _vector(True), backend, calls=2, grad_mode=False)


def sizes_out(x):
    return x.shape[0], x.shape[0] // 2 + 1, x[: x.shape[0] // 2] * 2


def test_dynamic_views_compile_once():
    """Views whose geometry depends on a size symbol are rebuilt per call from that call's sizes,
    within one symbolic compilation (no per-shape recompile)."""
    from kiln.api import context_of
    from kiln.autograd.aot import AOTCompiled

    compiled = kiln.compile(dynamic_views, backend="aot_eager", dynamic=True)
    check(dynamic_views, lambda call: (torch.linspace(-1.0, 2.0, 8 + 2 * call),), "aot_eager", calls=3,
          compiled=compiled)
    check(sizes_out, lambda call: (torch.linspace(-1.0, 2.0, 8 + 2 * call),), "aot_eager", calls=3, dynamic=True)
    # sizes_out's compile names the same backend: it shares the context, whose records hold both functions'
    records = [r for r in context_of(compiled).records if r.name == "dynamic_views" and r.graph is not None]
    assert len(records) == 1
    aot = records[0].compiled
    assert isinstance(aot, AOTCompiled) and aot.specialized is None, "fell back to compiling per shape"


def written_then_viewed(x):
    t = x + 1
    v = t[1:]
    t.mul_(2)
    return v, t[::2]


def mutated_input_view(x):
    x.mul_(2)
    return x[1:], x


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_view_of_an_intermediate_written_after_the_view(backend):
    check(written_then_viewed, _vector(True), backend, calls=2)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_views_of_an_input_written_in_place_keep_its_history(backend):
    """The input (a non-leaf that requires grad) is written: its views, and the gradient reaching the leaf."""
    results = []
    for fn in (mutated_input_view, kiln.compile(mutated_input_view, backend=backend)):
        w = torch.linspace(-1.0, 1.0, 6, requires_grad=True)
        x = w * 1
        view, same = fn(x)
        assert same is x and view._base is x
        (view * 3).sum().backward()
        results.append((view.detach(), x.detach(), w.grad))
    for e, a in zip(*results):
        torch.testing.assert_close(a, e)


# -- outputs eager creates that the functional graph would make an input or another output ---------------------
# Functionalization turns a write into the value written, and drops `copy(t, a)` as an identity: without care
# the graph then returns the input `a` itself, or one tensor for two outputs, where eager returns new tensors.

def written_with_the_input(x):
    t = x + 0.5
    t[...] = x
    return t


def written_with_the_input_then_viewed(x):
    t = x + 0.5
    t[...] = x
    return t[::2], x * 2


def written_with_the_input_then_split(x):
    t = x * 3
    t.copy_(x)
    return t.split(3)[1]


def written_with_another_output(x):
    t = x * 2
    u = x.sin()
    t.copy_(u)
    return u, t


def written_with_another_output_viewed(x):
    t = x.cos()
    u = x * 4
    t.copy_(u)
    return u[1:], t


def input_written_after_the_copy(x):
    t = x * 1
    t.copy_(x)
    x.add_(1)
    return t, x


def written_with_another_input(x, y):
    t = x - y
    t[...] = y
    return t, y


FRESH_OUTPUT_PROGRAMS = [written_with_the_input, written_with_the_input_then_viewed,
                         written_with_the_input_then_split, written_with_another_output,
                         written_with_another_output_viewed]


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("program", FRESH_OUTPUT_PROGRAMS, ids=lambda f: f.__name__)
def test_an_output_written_with_an_input_or_output_is_a_new_tensor(program, requires_grad):
    check(program, _vector(requires_grad, 6), "aot_eager", calls=2)


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("program", [written_with_the_input_then_viewed, written_with_another_output_viewed],
                         ids=lambda f: f.__name__)
def test_an_output_written_with_an_input_or_output_is_a_new_tensor_inductor(program, requires_grad):
    check(program, _vector(requires_grad, 6), "inductor", calls=2)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_an_output_copied_from_an_input_written_later_keeps_the_old_values(backend):
    """The copy is taken before the input's write: returning the input would show the write."""
    check(input_written_after_the_copy, _vector(False, 6), backend, calls=2)


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_an_output_written_with_another_input(backend, requires_grad):
    def make(call):
        return (torch.linspace(-1.0, 2.0, 6).requires_grad_(requires_grad), torch.linspace(3.0, 1.0, 6))
    check(written_with_another_input, make, backend, calls=2)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_an_output_written_with_an_input_under_no_grad_call(backend):
    check(written_with_the_input_then_viewed, _vector(True, 6), backend, calls=2, grad_mode=False)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_compiler_is_told_which_outputs_others_view(requires_grad):
    """The outputs rebuilt as views of another (`OutputAlias`) are rebuilt at their traced geometry, so the
    compiler is told which graph outputs they view (`meta["kiln.aot"]["alias_bases"]`) and must return those
    with their traced strides (a padded matmul's result is otherwise returned with its padded rows)."""
    told = []

    def compiler(gm, example_inputs):
        told.append((gm.meta["kiln.aot"]["kind"], gm.meta["kiln.aot"].get("alias_bases", ())))
        return run_graph(gm, example_inputs)

    def fn(x):
        y = x * 2
        return y, y[:, 1], x + 1

    x = torch.randn(4, 3, requires_grad=requires_grad)
    gm = torch.fx.symbolic_trace(fn)
    compiled = aot_compile(gm, [x], compiler)
    outs = compiled(x)
    for got, ref in zip(outs, fn(x)):
        torch.testing.assert_close(got, ref)
    kind, bases = told[0]
    assert kind == ("forward" if requires_grad else "inference") and len(bases) == 1, told


WEIGHT = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 9).reshape(3, 3))


def transposed_intermediate_beside_a_dead_product(t1):
    with torch.no_grad():
        t1.mul_(2)
    t1 = t1 + 1
    t2 = t1 @ WEIGHT  # a parameter makes the call a training one; nothing it computes is returned
    t3 = t1.transpose(0, -1)
    del t1, t2
    return t3


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_training_call_without_differentiable_outputs_returns_its_views(backend, dynamic):
    """Analyzed in grad mode, the transpose is a graph output of its own; the inference graph it reuses returns its
    base and rebuilds it as a view. Assembled by the first with the graph of the second, it came back untransposed
    (fuzz seed 431840, a `del` before a graph break): the inference graph serves only where it computes the same
    graph outputs."""
    check(transposed_intermediate_beside_a_dead_product,
          lambda call: [torch.randn(7 - call, 3, generator=torch.Generator().manual_seed(call))], backend,
          dynamic=dynamic, calls=2)


def real_view_returned_and_read(a):
    t = (a.to(torch.complex64) * 2.0).real  # a float view of a complex intermediate
    return (t * 3).exp(), t


def imag_view_returned_and_read(a):
    t = (a.to(torch.complex64) * 2.0j).imag
    return (t * 3).exp(), t


def conjugate_imag_returned_and_read(a):
    t = (a.to(torch.complex64) * (2.0 + 1.0j)).conj().imag  # a negated view: its values are -imag
    return (t * 3).exp(), t


def conjugate_real_returned_and_read(a):
    t = (a.to(torch.complex64) * 2.0).conj().real
    return (t * 3).exp(), t


def real_pairs_returned_and_read(a):
    t = torch.view_as_real(a.to(torch.complex64) * 2.0)[:-1]  # (n - 1, 2) floats over a complex intermediate
    return (t * 3).exp(), t


@pytest.mark.sampled(every=2, classes=("fn",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("fn", [real_view_returned_and_read, imag_view_returned_and_read,
                                real_pairs_returned_and_read, conjugate_imag_returned_and_read,
                                conjugate_real_returned_and_read])
def test_gradients_of_a_dtype_view_returned_and_read_meet_at_the_view_as_in_eager(fn, dynamic, backend):
    """The graph returns the intermediate base and the runtime rebuilds the view on it, so the output's gradient
    reaches the graph as a gradient of the base. Eager adds it to the gradient of the view's use inside the
    graph at the view, in the view's dtype; added at a complex base, ATen's complex add turns an infinite
    gradient into `inf + nanj` and the product after it spreads the NaN (fuzz seed 583189)."""
    compiled = kiln.compile(fn, backend=backend, dynamic=dynamic)
    for n in (3, 4):
        a = torch.tensor([float("inf"), 1.0, -2.0, 0.5][:n], requires_grad=True)
        kiln_a = a.detach().clone().requires_grad_()
        sum(t.abs().sum() for t in fn(a)).backward()
        sum(t.abs().sum() for t in compiled(kiln_a)).backward()
        torch.testing.assert_close(kiln_a.grad, a.grad, equal_nan=True)


def _write_the_view_then_backward(fn, a):
    u, t = fn(a)
    t.mul_(2)  # the returned view stays writable in place, its base's history rewritten as eager's
    (u.sum() + (t * t).sum()).backward()
    return a.grad


def _backward_twice(fn, a):
    u, t = fn(a)
    gradient, = torch.autograd.grad(u.sum() + (t * t).sum(), a, create_graph=True)
    gradient.sum().backward()  # the view's gradient, read off the base's, differentiates again
    return a.grad


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("use", [_write_the_view_then_backward, _backward_twice])
def test_a_real_view_read_in_the_graph_is_written_and_differentiated_as_eager_s(use, backend):
    a = torch.tensor([0.5, 1.0, -2.0], requires_grad=True)
    want = use(rotated_real_part, a)
    got = use(kiln.compile(rotated_real_part, backend=backend), a.detach().clone().requires_grad_())
    torch.testing.assert_close(got, want)


def negated_view_of_the_input(z):
    return z.conj().imag  # a view whose memory holds the negated values


def negated_view_of_an_intermediate(z):
    w = z * 2
    return w.conj().imag, w.conj().imag.exp()


def negated_view_of_a_real_input(x):
    return x._neg_view(), x._neg_view() * 3


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fn", [negated_view_of_the_input, negated_view_of_an_intermediate,
                                negated_view_of_a_real_input])
def test_a_returned_negated_view_keeps_its_negation(fn, backend):
    """A lazily negated view has no geometry that says so: rebuilt by one `as_strided` it read its memory's
    values, the wrong sign (torch.compile returns eager's); it is rebuilt by its view ops."""
    z = torch.tensor([1 + 2j, 3 - 1j, 0.5 + 0.25j])
    x = z if fn is not negated_view_of_a_real_input else z.real.clone()
    want, got = fn(x.clone()), kiln.compile(fn, backend=backend)(x.clone())
    for w, g in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
        torch.testing.assert_close(g, w)


def negated_view_transposed_in_place(a):
    t = (-a)._neg_view()
    t.t_()
    return t


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_returned_negated_view_that_does_not_replay_runs_eagers_ops_loudly(backend, monkeypatch):
    """A negated view made by an in-place view op (`t_`) does not replay, and one `as_strided` would drop its
    negation: the graph runs op by op (a counted fallback, an error under KILN_STRICT=1), with eager's values and
    autograd. Before, kiln's refusal reached the caller as a backend failure (fuzz seed 704703)."""
    monkeypatch.setenv("KILN_STRICT", "0")
    a = torch.randn(2, 3, requires_grad=True)
    before = len(kiln.fallbacks.records())
    got = kiln.compile(negated_view_transposed_in_place, backend=backend)(a)
    want = negated_view_transposed_in_place(a)
    torch.testing.assert_close(got, want)
    assert got.is_neg() and len(kiln.fallbacks.records()) > before
    monkeypatch.setenv("KILN_STRICT", "1")
    with pytest.raises(kiln.fallbacks.KilnStrictError, match="negated view"):  # a code of its own: compiled anew
        kiln.compile(lambda a: negated_view_transposed_in_place(a), backend=backend)(a)


def negated_view_beside_a_grad_mode_switch(a, b):
    with torch.no_grad():
        pass
    t = b + 1
    a.argmax(-1)
    return t, (-t)._neg_view()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_returned_negated_view_beside_a_grad_mode_switch_keeps_its_negation(backend):
    """An input that requires grad and reaches no output: the training variant is served by the inference graph
    where both return the same results. Analyzed without grad (its inputs as non-leaves that require grad, the
    grad-mode switch turning recording back on) the inference graph returns the negated view's base, analyzed in
    grad mode the view itself: same layout, other values. Compared by layout alone, kiln returned the base's
    memory, -1.5 where eager returns 1.5 (fuzz seeds 704804, 700442)."""
    a, b = torch.randn(3, 3, requires_grad=True), torch.tensor(0.5)
    got = kiln.compile(negated_view_beside_a_grad_mode_switch, backend=backend)(a, b)
    torch.testing.assert_close(got, negated_view_beside_a_grad_mode_switch(a, b))


def real_part_of_a_matrix(c):
    t = (c.to(torch.complex64) * (2.0 + 1.0j)).real
    return t, t == t


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_real_view_of_a_dynamic_matrix_is_traced(backend):
    """Two symbolic sizes: the rest of the base's gradient is sized by products tracing records (its storage's
    symbolic size, `2*s0*s1`, was one tracing could not rebuild: fuzz seed 593361)."""
    compiled = kiln.compile(real_part_of_a_matrix, backend=backend, dynamic=True)
    for m, n in ((2, 5), (3, 4)):
        c = torch.randn(m, n, dtype=torch.float64, requires_grad=True)
        kiln_c = c.detach().clone().requires_grad_()
        real_part_of_a_matrix(c)[0].exp().sum().backward()
        compiled(kiln_c)[0].exp().sum().backward()
        torch.testing.assert_close(kiln_c.grad, c.grad)


def real_part_returned_only(a):
    return (a.to(torch.complex64) * 2.0).real


def test_only_a_view_the_graph_also_reads_gets_its_gradient_at_the_view():
    """A real view the graph only returns meets no other gradient in the graph: its base keeps its own gradient,
    and its backward no second pass (an FFT model's `ifft(x).real` would run its FFT backward twice)."""
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    read = FlatProgram(torch.fx.symbolic_trace(real_view_returned_and_read), [a]).analyze((True,))
    returned = FlatProgram(torch.fx.symbolic_trace(real_part_returned_only), [a]).analyze((True,))
    assert read.gradients_at_views == (1,) and returned.gradients_at_views == ()


def rotated_real_part(a):
    t = (a.to(torch.complex64) * (2.0 + 1.0j))[1:].real
    return (t * 3).exp(), t


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_a_base_reached_through_the_returned_view_keeps_its_other_gradients(dynamic, backend):
    """The view's gradient is read off the base's, and the rest of the base's gradient, zero unless the caller
    reached the base through `t._base` (its imaginary parts, its first element), still reaches the inputs."""
    compiled = kiln.compile(rotated_real_part, backend=backend, dynamic=dynamic)
    for n in (3, 4):
        a = torch.tensor([0.5, 1.0, -2.0, 0.25][:n], requires_grad=True)
        kiln_a = a.detach().clone().requires_grad_()
        for fn, x in ((rotated_real_part, a), (compiled, kiln_a)):
            u, t = fn(x)
            (u.sum() + t.sum() + 5 * t._base.imag.sum() + 7 * t._base.real[0]).backward()
        torch.testing.assert_close(kiln_a.grad, a.grad)
