"""Dynamic shapes: dynamic=None (automatic), True and False, mark_dynamic, shape-relation guards."""
import logging
import warnings

import pytest
import torch

import kiln
from kiln.api import context_of


def batch_fn(x, w):
    b = x.shape[0]
    h = (x @ w).relu().view(b, -1, 2)
    return h.sum(1) * x.size(1), b * 2


def _run_sizes(c, sizes, width=4):
    w = torch.randn(width, 6)
    for n in sizes:
        x = torch.randn(n, width)
        out, b = c(x, w)
        ref, rb = batch_fn(x, w)
        torch.testing.assert_close(out, ref)
        assert b == rb


SIZES = [2, 3, 5, 7, 8, 11, 13, 16, 17, 20]


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_dynamic_none_compiles_at_most_twice_over_ten_batch_sizes(backend):
    c = kiln.compile(batch_fn, backend=backend)
    _run_sizes(c, SIZES)
    assert len(context_of(c).records) == 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_dynamic_true_compiles_once(backend):
    c = kiln.compile(batch_fn, backend=backend, dynamic=True)
    _run_sizes(c, SIZES)
    assert len(context_of(c).records) == 1


@pytest.mark.allows_fallback('frame_limit: the test reaches config.cache_size_limit')
def test_dynamic_false_recompiles_each_size_until_the_cache_limit_then_runs_eagerly():
    c = kiln.compile(batch_fn, backend="eager", dynamic=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run_sizes(c, SIZES)
    assert len(context_of(c).records) == kiln.config.cache_size_limit
    assert sum("cache_size_limit" in str(w.message) for w in caught) == 1


def test_recompile_log_names_the_dimension_that_became_dynamic(caplog):
    c = kiln.compile(batch_fn, backend="eager")
    with caplog.at_level(logging.INFO, logger="kiln.recompiles"):
        _run_sizes(c, [4, 6])
    assert "dimension 0 of L['x'] changed 4 -> 6" in caplog.text
    assert "now dynamic" in caplog.text


def test_sizes_zero_and_one_are_specialized():
    c = kiln.compile(batch_fn, backend="eager", dynamic=True)
    _run_sizes(c, [1, 5, 6])
    assert len(context_of(c).records) == 2  # size 1 is its own specialization; 5 and 6 share a graph


def test_equal_sizes_share_a_symbol_and_a_changed_relation_recompiles():
    def add(x, y):
        return x + y

    c = kiln.compile(add, backend="eager", dynamic=True)
    torch.testing.assert_close(c(torch.ones(4), torch.ones(4)), torch.full((4,), 2.0))
    torch.testing.assert_close(c(torch.ones(6), torch.ones(6)), torch.full((6,), 2.0))
    assert len(context_of(c).records) == 1
    x, y = torch.randn(5), torch.randn(1)  # unequal now: broadcasting, a different graph
    torch.testing.assert_close(c(x, y), x + y)
    assert len(context_of(c).records) == 2


def test_shape_relation_guard_fails_when_two_equal_inputs_become_unequal():
    def stack_rows(x, y):
        return torch.cat([x, y], dim=1) * x.shape[0]

    c = kiln.compile(stack_rows, backend="eager", dynamic=True)
    for n, m in ((3, 3), (5, 5), (5, 7)):
        x, y = torch.randn(n, 2), torch.randn(m, 2)
        if n == m:
            torch.testing.assert_close(c(x, y), stack_rows(x, y))
        else:
            with pytest.raises(RuntimeError):  # eager refuses too: the sizes must match for cat
                stack_rows(x, y)
    assert len(context_of(c).records) == 1
    first = context_of(c).records[0].program_source
    assert "shape relations" in first and "L['y'].size()[0] == L['x'].size()[0]" in first
    x, y = torch.randn(4, 2), torch.randn(4, 3)  # a relation that held (equal widths) no longer does
    torch.testing.assert_close(c(x, y), stack_rows(x, y))
    assert len(context_of(c).records) == 2


def test_mark_dynamic_makes_a_dimension_symbolic_from_the_first_call():
    c = kiln.compile(batch_fn, backend="eager", dynamic=False)
    w = torch.randn(4, 6)
    for n in (3, 9, 12):
        x = torch.randn(n, 4)
        kiln.mark_dynamic(x, 0)
        torch.testing.assert_close(c(x, w)[0], batch_fn(x, w)[0])
    assert len(context_of(c).records) == 1


def test_mark_static_keeps_a_dimension_specialized_under_dynamic_true():
    c = kiln.compile(batch_fn, backend="eager", dynamic=True)
    w = torch.randn(4, 6)
    for n in (3, 9):
        x = torch.randn(n, 4)
        kiln.mark_static(x, 0)
        torch.testing.assert_close(c(x, w)[0], batch_fn(x, w)[0])
    assert len(context_of(c).records) == 2


def test_python_loop_over_a_symbolic_size_specializes_with_a_guard():
    def rows(x):
        total = x[0] * 0
        for i in range(x.shape[0]):
            total = total + x[i]
        return total

    c = kiln.compile(rows, backend="eager", dynamic=True)
    for n in (3, 3, 4):
        x = torch.randn(n, 2)
        torch.testing.assert_close(c(x), rows(x))
    assert len(context_of(c).records) == 2


def test_symbolic_size_returned_to_python_is_an_int():
    def numel(x):
        return x.shape[0] * x.shape[1], x.size()

    c = kiln.compile(numel, backend="eager", dynamic=True)
    for n in (3, 6):
        x = torch.randn(n, 5)
        n_elem, size = c(x)
        assert n_elem == 5 * n and isinstance(n_elem, int)
        assert size == torch.Size([n, 5])


def test_parameters_stay_static_under_dynamic_true():
    lin = torch.nn.Linear(4, 3)
    c = kiln.compile(lin, backend="eager", dynamic=True)
    for n in (2, 7, 9):
        x = torch.randn(n, 4)
        torch.testing.assert_close(c(x), lin(x))
    assert len(context_of(c).records) == 1
    guards = context_of(c).records[0].program_source
    assert "v" in guards and "(3, 4)" in guards  # the weight's shape is checked exactly


def test_recompile_reason_names_the_one_relation_that_failed(caplog):
    def total(x, y):
        return x.sum() + y.sum() * y.shape[0]

    c = kiln.compile(total, backend="eager", dynamic=True)
    c(torch.ones(4), torch.ones(4))  # equal sizes: one symbol for both, with the relation as a guard
    with caplog.at_level(logging.INFO, logger="kiln.recompiles"):
        x, y = torch.randn(5), torch.randn(7)
        torch.testing.assert_close(c(x, y), total(x, y))
    (reason,) = [r.message for r in caplog.records if "recompiling" in r.message]
    assert "shape relations guard failed" in reason and "L['y'].size()[0] == L['x'].size()[0]" in reason
    assert "storage_offset" not in reason  # only the failed relation, not all of them


def size_keyed_containers(x):
    d = {x.shape[0]: "rows", 4: "cols"}
    s = {x.shape[0], 4}
    return x * len(d) + len(s), x.shape[0] in d


def test_dynamic_size_as_a_dict_or_set_key_is_specialized_without_a_break():
    """A key must be a concrete value: the size is specialized and guarded (one graph per size, as
    torch.compile), never a break; size 4 collides with the literal key 4 as it does eagerly."""
    c = kiln.compile(size_keyed_containers, backend="eager")
    for n in (2, 3, 4, 5):
        x = torch.randn(n, 4)
        expected, actual = size_keyed_containers(x), c(x)
        torch.testing.assert_close(actual[0], expected[0])
        assert actual[1] == expected[1]
    records = context_of(c).records
    assert len(records) == 4 and all(r.graph_break is None for r in records)


class _State:
    pass


@pytest.mark.parametrize("store", ["shape", "size", "sum_of_sizes", "size_tuple"])
def test_size_specialized_by_an_op_flows_into_python_state_as_an_int(store):
    """`torch.split(x, 1)` makes the size a constant (its number of outputs); a size read after that is a
    SymInt whose expression is a number: what reaches Python state must still be eager's plain int."""
    def f(x, state):
        parts = torch.split(x, 1, dim=-1)
        value = {"shape": lambda: x.shape[0], "size": lambda: x.size(1),
                 "sum_of_sizes": lambda: getattr(state, "total", 0) + x.shape[0] + x.shape[2],
                 "size_tuple": lambda: tuple(x.shape)}[store]()
        state.total = value
        return parts[0] * 2

    c = kiln.compile(f, backend="eager", dynamic=None)
    for n in (6, 2, 5):
        eager_state, kiln_state, x = _State(), _State(), torch.randn(n, n, n)
        torch.testing.assert_close(c(x, kiln_state), f(x, eager_state))
        assert type(kiln_state.total) is type(eager_state.total) and kiln_state.total == eager_state.total
        if store == "size_tuple":
            assert all(type(v) is int for v in kiln_state.total)


def _size_then_in_place_view(op):
    """Reads a symbolic size as a Python int, then changes the input's metadata in place with `op`."""
    def fn(x):
        n = int(x.numel())
        op(x)
        return n, x * 2
    return fn


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("op", [
    torch.Tensor.t_,
    lambda x: x.unsqueeze_(0),
    lambda x: x.transpose_(0, 1),
    lambda x: x.as_strided_((x.shape[1], x.shape[0]), (1, x.shape[1])),
], ids=["t_", "unsqueeze_", "transpose_", "as_strided_"])
def test_shape_guards_describe_an_input_as_passed_not_after_an_in_place_view_op(backend, op):
    # The guards on a symbolic size were read from the input's fake after the op had changed its
    # sizes: the relation `x.size(1) == 4` that int(x.numel()) specialized was lost, and a later
    # call with another width reused the first width's constant.
    fn = _size_then_in_place_view(op)
    c = kiln.compile(fn, backend=backend)
    for n, m in [(2, 3), (2, 4), (2, 3), (2, 5)]:
        x = torch.randn(n, m)
        ref_x, kiln_x = x.clone(), x.clone()
        ref_n, ref_out = fn(ref_x)
        kiln_n, kiln_out = c(kiln_x)
        assert kiln_n == ref_n
        torch.testing.assert_close(kiln_out, ref_out)
        assert kiln_x.shape == ref_x.shape and kiln_x.stride() == ref_x.stride()


# views passed without their base: the fake of such an input has a base with symbolic sizes of its own,
# which no input is the source of
VIEWS_WITHOUT_BASE = {
    "a slice": lambda base: base[1:],
    "a strided slice": lambda base: base[::2],
    "a row of a reshape": lambda base: base.view(2, -1)[1],
    "unsqueezed in place": lambda base: base[1:],
}


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("view", list(VIEWS_WITHOUT_BASE))
def test_a_view_input_whose_base_is_not_an_input_compiles_over_changing_sizes(view, dynamic):
    def f(d, e):
        if view == "unsqueezed in place":
            d = d.unsqueeze_(0)
        return d * 2 + e.sum(), d.shape[-1]

    compiled = kiln.compile(f, backend="eager", dynamic=dynamic)
    for n in (4, 8, 6, 10):
        eager_base, kiln_base = torch.arange(float(n)), torch.arange(float(n))
        expected = f(VIEWS_WITHOUT_BASE[view](eager_base), torch.ones(n))
        got = compiled(VIEWS_WITHOUT_BASE[view](kiln_base), torch.ones(n))
        assert torch.equal(got[0], expected[0]) and got[1] == expected[1]


# in-place view ops that change an input's sizes inside the graph
IN_PLACE_VIEW_OPS = {
    "unsqueeze_": lambda x: x.unsqueeze_(0),
    "t_": lambda x: x.t_(),
    "transpose_": lambda x: x.transpose_(0, 1),
    "squeeze_": lambda x: x.squeeze_(1),
    "as_strided_": lambda x: x.as_strided_((x.shape[1], x.shape[0]), (1, x.shape[1])),
}


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("op", list(IN_PLACE_VIEW_OPS))
def test_sizes_returned_after_an_in_place_view_op_are_the_new_ones(op, backend):
    """A symbolic size returned to Python is read from the inputs as passed, before the graph changes
    their sizes in place: `x.t_(); return x.shape` gives the transposed sizes, as in eager."""
    def f(x):
        y = IN_PLACE_VIEW_OPS[op](x)
        return y * 2, tuple(x.shape), x.shape[0] + x.shape[-1] * 10

    compiled = kiln.compile(f, backend=backend, dynamic=True)
    for rows in (3, 5, 4):
        shape = (rows, 1) if op == "squeeze_" else (rows, rows + 2)
        expected, got = f(torch.randn(shape)), compiled(torch.randn(shape))
        assert got[0].shape == expected[0].shape and got[1:] == expected[1:]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("dynamic", [True, None])
def test_an_input_whose_view_is_an_earlier_argument_gets_the_guard_of_its_traced_sizes(backend, dynamic):
    """`f(a, a[::2])`, the view read first: its fake made `a`'s with static sizes (the fake mode keeps one fake per
    tensor), while `a`'s guard left its rows unchecked as dynamic. The graph traced for 3 rows then ran on 4,
    returning 3 (fuzz seed 470191). The guard checks the sizes the graph was traced for."""
    w = torch.randn(3, 3)

    def f(a, b):
        seen = b == -5
        return (a * 1.5 + 0.5) * w.sum(), seen

    compiled = kiln.compile(f, dynamic=dynamic, backend=backend)
    for n in (3, 4, 5, 6):
        a = torch.randn(n, 3)
        got, want = compiled(a, a[::2]), f(a, a[::2])
        assert got[0].shape == want[0].shape
        torch.testing.assert_close(got, want)
