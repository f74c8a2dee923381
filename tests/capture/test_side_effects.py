"""Side effects of traced code on Python state happen, in program order, exactly as in eager:
attribute writes, globals, list and dict mutations, closure cells, and across graph breaks."""
import pytest
import torch
import torch.nn as nn

import kiln
from support.capture import t

COUNTER = 0
LOG = []
STATE = {}


def _both(fn, make_state, *args):
    """Run fn eagerly and compiled on two copies of the same state; return both states and results."""
    e_state, c_state = make_state(), make_state()
    e_out = fn(e_state, *args)
    c_out = kiln.compile(fn, backend="eager")(c_state, *args)
    return e_state, c_state, e_out, c_out


class Box:
    def __init__(self):
        self.value = 0
        self.history = []


def attr_writes(box, x):
    box.value = 1
    box.value = box.value + 1
    box.history.append(box.value)
    box.tensor = x * 2
    return x + box.value


def attr_read_after_write(box, x):
    box.scale = 3.0
    y = x * box.scale
    box.scale = box.scale * 2
    return y * box.scale


def attr_delete(box, x):
    box.tmp = 5
    del box.tmp
    return x * 2


def list_ops(xs, x):
    xs.append(x.shape[0])
    xs.insert(0, 1)
    xs.extend([2, 3])
    xs.pop(1)
    xs.remove(2)
    xs[0] = "first"
    return len(xs)


def list_clear_then_fill(xs, x):
    xs.clear()
    xs += [x, x * 2]
    return x


def dict_ops(d, x):
    d["a"] = x
    d.update(b=2, c=x * 3)
    del d["old"]
    d.setdefault("z", [])
    d["z"].append(1)
    return x * len(d)


def nested_container(state, x):
    state["log"].append(("start", x.shape[0]))
    state["count"] += 1
    state["log"].append(("end", state["count"]))
    return x + state["count"]


def _box():
    return Box()


def _list():
    return ["keep", "x"]


def _dict():
    return {"old": 1, "k": 2}


def _nested():
    return {"log": [], "count": 0}


CASES = [
    (attr_writes, _box),
    (attr_read_after_write, _box),
    (attr_delete, _box),
    (list_ops, _list),
    (list_clear_then_fill, _list),
    (dict_ops, _dict),
    (nested_container, _nested),
]


def _state_of(s):
    if isinstance(s, Box):
        return {k: v for k, v in vars(s).items()}
    return s


@pytest.mark.parametrize("fn,make", CASES, ids=[c[0].__name__ for c in CASES])
def test_mutation_matches_eager(fn, make):
    x = t(3)
    e_state, c_state, e_out, c_out = _both(fn, make, x)
    torch.testing.assert_close(c_out, e_out)
    e, c = _state_of(e_state), _state_of(c_state)
    assert type(e) is type(c)
    if isinstance(e, dict):
        assert list(e) == list(c)
        for k in e:
            if isinstance(e[k], torch.Tensor):
                torch.testing.assert_close(c[k], e[k])
            else:
                assert c[k] == e[k], (k, c[k], e[k])
    else:
        assert len(c) == len(e)
        for a, b in zip(e, c):
            if isinstance(a, torch.Tensor):
                torch.testing.assert_close(b, a)
            else:
                assert a == b


def bump_global(x):
    global COUNTER
    COUNTER += 1
    LOG.append(COUNTER)
    STATE["last"] = COUNTER
    return x * COUNTER


def test_global_mutations_each_call():
    global COUNTER
    COUNTER = 0
    LOG.clear()
    STATE.clear()
    c = kiln.compile(bump_global, backend="eager")
    x = t(3)
    outs = [c(x) for _ in range(3)]
    assert COUNTER == 3 and LOG == [1, 2, 3] and STATE == {"last": 3}
    for i, out in enumerate(outs, start=1):
        torch.testing.assert_close(out, x * i)


def test_global_new_name_created():
    ns = {}
    exec("def fn(x):\n    global made\n    made = x * 2\n    return made + 1", ns)
    c = kiln.compile(ns["fn"], backend="eager")
    x = t(3)
    out = c(x)
    torch.testing.assert_close(ns["made"], x * 2)
    torch.testing.assert_close(out, x * 2 + 1)


def test_mutations_around_break_in_order(capsys):
    events = []

    def fn(x):
        events.append(1)
        y = x * 2
        print("p")
        events.append(2)
        events.append(len(events))
        return y

    c = kiln.compile(fn, backend="eager")
    c(t(2))
    assert events == [1, 2, 2]


def test_module_attribute_counter():
    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.calls = 0
            self.cache = {}

        def forward(self, x):
            self.calls += 1
            y = self.fc(x)
            self.cache["last"] = y
            self.last_shape = tuple(y.shape)
            return y

    torch.manual_seed(0)
    m = Counting()
    c = kiln.compile(m, backend="eager")
    x = t(2, 3)
    for _ in range(3):
        out = c(x)
    assert m.calls == 3
    assert m.last_shape == (2, 3)
    torch.testing.assert_close(m.cache["last"], out)
    torch.testing.assert_close(out, m.fc(x))


def test_closure_cell_written_by_compiled_function():
    total = 0

    def fn(x):
        nonlocal total
        total += 1
        return x * total

    c = kiln.compile(fn, backend="eager")
    x = t(3)
    torch.testing.assert_close(c(x), x * 1)
    torch.testing.assert_close(c(x), x * 2)
    assert total == 2


def test_tensor_attribute_stored_and_read_back():
    box = Box()

    def fn(x):
        box.t = x.sin()
        return box.t * 2

    c = kiln.compile(fn, backend="eager")
    x = t(3)
    torch.testing.assert_close(c(x), x.sin() * 2)
    torch.testing.assert_close(box.t, x.sin())


def test_list_aliasing_preserved():
    shared = []
    holder = {"a": shared, "b": shared}

    def fn(x):
        holder["a"].append(x)
        return len(holder["b"])

    c = kiln.compile(fn, backend="eager")
    assert c(t(2)) == 1
    assert len(shared) == 1 and holder["a"] is holder["b"] is shared


def test_inplace_on_buffer_visible():
    class Acc(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", torch.zeros(3))

        def forward(self, x):
            self.total += x
            return self.total * 1

    m = Acc()
    c = kiln.compile(m, backend="eager")
    x = t(3)
    c(x)
    c(x)
    torch.testing.assert_close(m.total, 2 * x)


def test_a_kwarg_popped_and_renamed_then_mutated_through_its_new_key():
    """transformers' deprecation wrapper: `kwargs['cache'] = kwargs.pop('past_key_values')`, then the cache is
    updated in place. The replay reads the cache through the path it had when the call began, not through
    the key that an earlier replayed effect deleted."""
    class Cache:
        pass

    def rename(x, **kwargs):
        kwargs["cache"] = kwargs.pop("past")
        kwargs["cache"].length = 3
        return x + 1, kwargs

    compiled = kiln.compile(rename, backend="eager", fullgraph=True)
    for _ in range(2):
        cache, x = Cache(), t(2)
        out, kwargs = compiled(x, past=cache)
        assert kwargs == {"cache": cache} and cache.length == 3
        torch.testing.assert_close(out, x + 1)
