"""Guards and recompiles: what the graph specialized on is checked on every call; a failed
guard recompiles and logs which guard failed with the old and new value; past
`cache_size_limit` the frame runs eagerly with one warning."""
import logging
import warnings

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.api import context_of
from support.capture import t

FLAG = True
FACTOR = 2.0


@pytest.fixture
def recompiles(caplog):
    caplog.set_level(logging.INFO, logger="kiln.recompiles")
    return caplog


def _messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "kiln.recompiles"]


def _compiled(fn, **kw):
    return kiln.compile(fn, backend="eager", **kw)


def simple(x):
    return x * 2 + 1


@pytest.mark.parametrize("first,second,needle", [
    (lambda: t(3), lambda: t(3, dtype=torch.float64), "torch.float64"),
    (lambda: t(3), lambda: t(4), "shape=[4]"),
    (lambda: t(3, 4), lambda: t(4, 3).T, "stride=[1, 3]"),
    (lambda: t(3), lambda: t(3, grad=True), "requires_grad=True"),
    (lambda: t(2, 2), lambda: t(2, 2, 1), "shape=[2, 2, 1]"),
    (lambda: torch.arange(3), lambda: torch.arange(3.0), "torch.float32"),
], ids=["dtype", "shape", "stride", "requires_grad", "rank", "int_to_float"])
def test_tensor_guard_recompiles(recompiles, first, second, needle):
    c = _compiled(simple)
    a = first()
    torch.testing.assert_close(c(a), simple(a))
    a2 = first()
    torch.testing.assert_close(c(a2), simple(a2))
    assert len(context_of(c).records) == 1
    b = second()
    torch.testing.assert_close(c(b), simple(b))
    assert len(context_of(c).records) == 2
    msgs = _messages(recompiles)
    assert len(msgs) == 1
    assert "tensor guard failed on L['x']" in msgs[0] and needle in msgs[0], msgs[0]
    assert "expected" in msgs[0] and "got" in msgs[0]
    torch.testing.assert_close(c(a), simple(a))  # the first entry still serves the old inputs
    assert len(context_of(c).records) == 2


def reads_global(x):
    if FLAG:
        return x * FACTOR
    return x - FACTOR


def test_changed_global_bool_recompiles(recompiles):
    global FLAG
    c = _compiled(reads_global)
    x = t(3)
    torch.testing.assert_close(c(x), reads_global(x))
    FLAG = False
    try:
        torch.testing.assert_close(c(x), reads_global(x))
    finally:
        FLAG = True
    assert len(context_of(c).records) == 2
    msg = _messages(recompiles)[0]
    assert "G['FLAG']" in msg and "expected True" in msg and "got False" in msg, msg


def test_changed_global_float_recompiles(recompiles):
    global FACTOR
    c = _compiled(reads_global)
    x = t(3)
    c(x)
    FACTOR = 5.0
    try:
        torch.testing.assert_close(c(x), reads_global(x))
    finally:
        FACTOR = 2.0
    assert len(context_of(c).records) == 2
    msg = _messages(recompiles)[0]
    assert "G['FACTOR']" in msg and "2.0" in msg and "5.0" in msg, msg


def test_unchanged_global_does_not_recompile():
    c = _compiled(reads_global)
    for _ in range(3):
        c(t(3))
    assert len(context_of(c).records) == 1


def test_python_int_argument_recompiles_on_change(recompiles):
    def fn(x, n):
        return x * n

    c = _compiled(fn)
    x = t(3)
    c(x, 2)
    c(x, 2)
    assert len(context_of(c).records) == 1
    torch.testing.assert_close(c(x, 3), x * 3)
    assert len(context_of(c).records) == 2
    assert "L['n']" in _messages(recompiles)[0]


def test_string_argument_recompiles(recompiles):
    def fn(x, mode):
        return x.relu() if mode == "relu" else x.sigmoid()

    c = _compiled(fn)
    x = t(3)
    torch.testing.assert_close(c(x, "relu"), x.relu())
    torch.testing.assert_close(c(x, "sig"), x.sigmoid())
    assert len(context_of(c).records) == 2
    assert "'relu'" in _messages(recompiles)[0] and "'sig'" in _messages(recompiles)[0]


def test_none_vs_tensor_argument_recompiles():
    def fn(x, b=None):
        return x if b is None else x + b

    c = _compiled(fn)
    x = t(3)
    torch.testing.assert_close(c(x * 1), x)
    torch.testing.assert_close(c(x, x), x + x)
    assert len(context_of(c).records) == 2


def test_list_length_guard(recompiles):
    def fn(xs):
        return sum(xs)

    c = _compiled(fn)
    two = [t(2), t(2)]
    torch.testing.assert_close(c(two), two[0] + two[1])
    xs = [t(2), t(2), t(2)]
    torch.testing.assert_close(c(xs), xs[0] + xs[1] + xs[2])
    assert len(context_of(c).records) == 2
    assert "length guard failed" in _messages(recompiles)[0]


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.scale = 2.0
        self.use_bias = True

    def forward(self, x):
        y = self.fc(x) * self.scale
        if self.use_bias:
            y = y + 1
        if self.training:
            y = y * 10
        return y


def test_module_attribute_change_recompiles(recompiles):
    m = Scaled()
    c = kiln.compile(m, backend="eager")
    x = t(2, 3)
    torch.testing.assert_close(c(x), m(x))
    m.scale = 3.0
    torch.testing.assert_close(c(x), m(x))
    m.use_bias = False
    torch.testing.assert_close(c(x), m(x))
    assert len(context_of(c).records) == 3
    msgs = _messages(recompiles)
    assert "scale" in msgs[0] and "2.0" in msgs[0] and "3.0" in msgs[0], msgs[0]
    assert "use_bias" in msgs[1] and "True" in msgs[1] and "False" in msgs[1], msgs[1]


def test_setattr_through_optimized_module_recompiles():
    m = Scaled()
    c = kiln.compile(m, backend="eager")
    x = t(2, 3)
    c(x)
    c.scale = 4.0  # passes through to the original module
    assert m.scale == 4.0
    torch.testing.assert_close(c(x), m(x))
    assert len(context_of(c).records) == 2


def test_train_to_eval_recompiles(recompiles):
    m = Scaled().train()
    c = kiln.compile(m, backend="eager")
    x = t(2, 3)
    torch.testing.assert_close(c(x), m(x))
    c.eval()
    assert not m.training
    torch.testing.assert_close(c(x), m(x))
    assert len(context_of(c).records) == 2
    msg = _messages(recompiles)[0]
    assert "training" in msg and "True" in msg and "False" in msg, msg
    c.train()
    torch.testing.assert_close(c(x), m(x))
    assert len(context_of(c).records) == 2  # both entries are cached


def test_dropout_train_eval_recompiles():
    m = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    c = kiln.compile(m, backend="eager")
    x = t(4, 3)
    c(x)
    m.eval()
    torch.testing.assert_close(c(x), m(x))
    assert len(context_of(c).records) == 2


def test_grad_mode_change_recompiles(recompiles):
    c = _compiled(simple)
    x = t(3, grad=True)
    assert c(x).requires_grad
    with torch.no_grad():
        out = c(x)
    assert not out.requires_grad
    assert len(context_of(c).records) == 2
    msg = _messages(recompiles)[0]
    assert "grad mode" in msg and "True" in msg and "False" in msg, msg


def test_tf32_matmul_setting_change_recompiles(recompiles):
    # a compiled float32 matmul (a Triton template) is built for TF32 or IEEE precision, as eager's cuBLAS
    # follows torch.backends.cuda.matmul.allow_tf32 per call
    c = _compiled(simple)
    x = t(3)
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        c(x)
        torch.backends.cuda.matmul.allow_tf32 = not before
        c(x)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert len(context_of(c).records) == 2
    msg = _messages(recompiles)[0]
    assert "matmul precision" in msg and "TF32 matmuls" in msg, msg


def test_replaced_parameter_recompiles():
    m = nn.Linear(3, 3)
    c = kiln.compile(m, backend="eager")
    x = t(2, 3)
    c(x)
    with torch.no_grad():
        m.weight.mul_(2)  # same tensor, new values: no recompile, new result
    torch.testing.assert_close(c(x), m(x))
    assert len(context_of(c).records) == 1
    m.weight = nn.Parameter(torch.randn(3, 3, dtype=torch.float64))
    m.bias = nn.Parameter(torch.randn(3, dtype=torch.float64))
    x64 = x.double()
    torch.testing.assert_close(c(x64), m(x64))
    assert len(context_of(c).records) == 2


def test_parameter_data_swapped_for_its_transpose_recompiles():
    """`p.data = p.data.t()` keeps the parameter object, its storage and its shape (square): only the
    strides tell, and the compiled code read the old ones."""
    m = nn.Linear(3, 3)
    c = kiln.compile(m)
    x = t(2, 3)
    torch.testing.assert_close(c(x), m(x))
    m.weight.data = m.weight.data.t()
    torch.testing.assert_close(c(x), m(x))
    assert len(context_of(c).records) == 2


def test_closure_value_change_recompiles():
    k = 2

    def fn(x):
        return x * k

    c = _compiled(fn)
    x = t(3)
    torch.testing.assert_close(c(x), x * 2)
    k = 5
    torch.testing.assert_close(c(x), x * 5)
    assert len(context_of(c).records) == 2


def test_swapped_function_global_recompiles():
    ns = {"act": torch.relu}
    exec("def fn(x):\n    return act(x)", ns)
    c = _compiled(ns["fn"])
    x = t(5)
    torch.testing.assert_close(c(x), torch.relu(x))
    ns["act"] = torch.sigmoid
    torch.testing.assert_close(c(x), torch.sigmoid(x))
    assert len(context_of(c).records) == 2


@pytest.mark.allows_fallback('frame_limit: the test reaches config.cache_size_limit')
def test_cache_size_limit_then_eager_with_one_warning(monkeypatch):
    monkeypatch.setattr(kiln.config, "cache_size_limit", 3)

    def fn(x, n):
        for _ in range(n):  # the loop's trip count is read as a Python value: one entry per value
            x = x + 1
        return x

    c = _compiled(fn)
    x = t(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(8):
            torch.testing.assert_close(c(x, n), x + n)
    assert len(context_of(c).records) == 3
    limit = [w for w in caught if "cache_size_limit" in str(w.message)]
    assert len(limit) == 1, [str(w.message) for w in caught]
    assert "fn" in str(limit[0].message)


def test_guards_are_one_function():
    c = _compiled(simple)
    c(t(3))
    ctx = context_of(c)
    entry = next(iter(ctx.frames.values())).entries[0]
    source = entry.guards.source_code()
    assert source.startswith("def guard(L, G, C):") and source.count("def ") == 1
    assert "L['x']" in source and "# tensor" in source and "# grad mode" in source
    assert entry.guard({"x": t(3)}, {}, ()) is True
    assert entry.guard({"x": t(4)}, {}, ()) is False


def test_guard_kinds_listed_in_record():
    m = Scaled()
    c = kiln.compile(m, backend="eager")
    c(t(2, 3))
    kinds = {g.kind.value for g in context_of(c).records[0].guards.guards}
    assert {"tensor", "grad mode", "constant"} <= kinds, kinds


def test_reset_forgets_compiled_frames():
    c = _compiled(simple)
    c(t(3))
    assert len(context_of(c).records) == 1
    kiln.reset()
    assert len(context_of(c).records) == 0
    c(t(3))
    assert len(context_of(c).records) == 1


def test_guard_reuses_bound_locals_and_replaces_whole_tokens_only():
    from kiln.capture.guards import _use_locals

    exprs = {"L['a']": "v3", "L['a'].b": "v4", "getattr(L['m'], '0')": "v5"}
    # `L['a']` inside `L['a1']` or `L['a'].bc` is not the bound source; text in literals is left alone
    assert _use_locals("L['a1'] is L['a'] and L['a'].bc is L['a'].b", exprs) == "L['a1'] is v3 and v3.bc is v4"
    assert _use_locals("list(L['a'].keys()) == [\"L['a']\"]", exprs) == "list(v3.keys()) == [\"L['a']\"]"
    assert _use_locals("hasattr(getattr(L['m'], '0').x, 'y') is False", exprs) == "hasattr(v5.x, 'y') is False"


class _Inner(nn.Module):
    def forward(self, x):
        return x + 1


class _Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([_Inner()])

    def forward(self, x):
        inner = self.layers[0]
        if hasattr(inner, "extra"):
            return inner(x) * inner.extra
        return inner(x)


def test_hasattr_guard_on_a_nested_module_reads_its_local_and_still_recompiles(recompiles):
    m = _Outer()
    c = kiln.compile(m, backend="eager")
    x = t(3)
    torch.testing.assert_close(c(x), m(x))
    source = context_of(c).records[0].guards.source_code()
    assert "if not (hasattr(v" in source, source  # not re-fetched from L['self'] through Module.__getattr__
    m.layers[0].extra = 3.0
    torch.testing.assert_close(c(x), (x + 1) * 3.0)
    assert len(context_of(c).records) == 2
    assert any("has attribute" in msg and "extra" in msg for msg in _messages(recompiles)), _messages(recompiles)


class _Config:
    """Like transformers' PretrainedConfig: attribute reads run Python code."""

    def __init__(self):
        self.scale = 2.0

    def __getattribute__(self, name):
        return super().__getattribute__(name)

    def describe(self):
        return "class"


class _Configured(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = _Config()

    def forward(self, x):
        return x * self.config.scale if self.config.describe() == "class" else x


def test_not_shadowed_guard_reuses_the_dict_local_and_still_recompiles(recompiles):
    m = _Configured()
    c = kiln.compile(m, backend="eager")
    x = t(3)
    torch.testing.assert_close(c(x), x * 2.0)
    source = context_of(c).records[0].guards.source_code()
    assert "not in v" in source and ".__dict__):" not in source, source
    m.config.describe = lambda: "instance"  # the instance now shadows the method
    torch.testing.assert_close(c(x), x)
    assert len(context_of(c).records) == 2
    assert any("not shadowed" in msg and "describe" in msg for msg in _messages(recompiles)), _messages(recompiles)


def _always_checked(source: str) -> list[str]:
    """The guard function's checks that run on every call (not inside an `if S is not R:` block)."""
    return [line for line in source.splitlines() if line.startswith(" " * 8 + "if not (")]


def _guard_source(m: nn.Module, *args) -> str:
    c = kiln.compile(m, backend="eager")
    torch.testing.assert_close(c(*args), m(*args))
    return context_of(c).records[0].guards.source_code()


@pytest.mark.parametrize("config_cls", ["PlainConfig", "MappedConfig"])
def test_shared_config_is_checked_once(config_cls):
    from .test_guards_state import MappedConfig, PlainConfig, shared_config_layers

    _, m = shared_config_layers({"PlainConfig": PlainConfig, "MappedConfig": MappedConfig}[config_cls])
    source = _guard_source(m, t(3))
    always = "\n".join(_always_checked(source))
    assert "'0').config.scale" in always and "'1').config" not in always and "'2').config" not in always, source
    assert source.count("is not v") == 2, source  # one test per other layer: is its config the first one's?


def test_module_reached_twice_is_checked_once():
    lin = nn.Linear(3, 3)
    source = _guard_source(nn.Sequential(lin, nn.ReLU(), lin), t(2, 3))
    assert "id: getattr(L['self'], '2')" in source, source  # the identity check stays
    assert "module hooks: getattr(L['self'], '2')" not in source and "'2').weight" not in source, source


def test_tied_weight_is_checked_once():
    from .test_guards_state import TiedLinears

    source = _guard_source(TiedLinears(), t(2, 3))
    assert "id: L['self'].b.weight" in source and "tensor: L['self'].b.weight" not in source, source
    assert "tensor: L['self'].a.weight" in source and "tensor: L['self'].b.bias" in source, source


def test_module_hooks_read_from_the_module_dict():
    source = _guard_source(nn.Sequential(nn.Linear(3, 3)), t(2, 3))
    hooks = [line for line in source.splitlines() if "# module hooks: " in line]
    assert hooks and all("['_forward_hooks']" in line and "._forward_hooks" not in line for line in hooks), source


def test_a_branch_on_a_number_guards_its_outcome_not_its_value():
    """`if s > 0` on a number from the caller (or from `.item()` before a break) recompiles only when the
    outcome changes; a number used as a value is specialized exactly until its value changes once."""
    def branch(x, s):
        return x + 1 if s > 0 else x - 1

    def value(x, s):
        return x * s

    x = torch.randn(3)
    compiled_branch, compiled_value = kiln.compile(branch, backend="eager"), kiln.compile(value, backend="eager")
    for s in (0.5, 2.0, -1.0, -3.0, 7):
        torch.testing.assert_close(compiled_branch(x, s), branch(x, s))
        torch.testing.assert_close(compiled_value(x, s), value(x, s))
    # the two calls name one backend: they share a context, which holds the records of both functions
    branch_records, value_records = ([r for r in context_of(compiled).records if r.name == name]
                                     for compiled, name in ((compiled_branch, "branch"), (compiled_value, "value")))
    assert len(branch_records) == 3  # s > 0 (float), s <= 0 (float), an int s
    # 0.5; then s is a graph input (automatic dynamic) for every float; the int 7 is a new type
    assert len(value_records) == 3
    assert "L['s'] > 0 is True" in str(branch_records[0].guards)
