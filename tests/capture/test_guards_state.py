"""Python state the graph read must be guarded: after each change below, the compiled function
must give eager's answer (by recompiling), never a stale one."""
import pytest
import torch
import torch.nn as nn

import kiln
from kiln.api import context_of
from support.capture import t

CONFIG = {"scale": 2.0, "mode": "relu"}
SIZES = [1, 2]


class Settings:
    factor = 3.0

    def __init__(self):
        self.bias = 1.0


SETTINGS = Settings()


def reads_dict(x):
    y = x * CONFIG["scale"]
    return y.relu() if CONFIG["mode"] == "relu" else y.tanh()


def reads_list(x):
    return x * sum(SIZES) + len(SIZES)


def reads_object(x):
    return x * SETTINGS.factor + SETTINGS.bias


def _mutate_dict():
    CONFIG["scale"] = 5.0
    CONFIG["mode"] = "tanh"


def _restore_dict():
    CONFIG["scale"] = 2.0
    CONFIG["mode"] = "relu"


def _mutate_list():
    SIZES.append(7)


def _restore_list():
    del SIZES[2:]


def _mutate_list_item():
    SIZES[0] = 10


def _restore_list_item():
    SIZES[0] = 1


def _mutate_instance():
    SETTINGS.bias = -4.0


def _restore_instance():
    SETTINGS.bias = 1.0


def _mutate_class():
    Settings.factor = 0.5


def _restore_class():
    Settings.factor = 3.0


@pytest.mark.parametrize("fn,mutate,restore", [
    (reads_dict, _mutate_dict, _restore_dict),
    (reads_list, _mutate_list, _restore_list),
    (reads_list, _mutate_list_item, _restore_list_item),
    (reads_object, _mutate_instance, _restore_instance),
    (reads_object, _mutate_class, _restore_class),
], ids=["dict_values", "list_append", "list_item", "instance_attr", "class_attr"])
def test_mutated_global_state_is_seen(fn, mutate, restore):
    c = kiln.compile(fn, backend="eager")
    x = t(3)
    torch.testing.assert_close(c(x), fn(x))
    mutate()
    try:
        torch.testing.assert_close(c(x), fn(x))
    finally:
        restore()
    torch.testing.assert_close(c(x), fn(x))
    assert len(context_of(c).records) == 2


def test_mutated_default_argument_is_seen():
    def fn(x, opts={"k": 2}):  # noqa: B006
        return x * opts["k"]

    c = kiln.compile(fn, backend="eager")
    x = t(3)
    torch.testing.assert_close(c(x), x * 2)
    fn.__defaults__[0]["k"] = 7
    torch.testing.assert_close(c(x), x * 7)


def test_hook_added_after_compile_is_honoured():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    c = kiln.compile(m, backend="eager")
    x = t(2, 3)
    c(x)
    handle = m[0].register_forward_hook(lambda mod, inp, out: out * 100)
    try:
        torch.testing.assert_close(c(x), m(x))
    finally:
        handle.remove()
    torch.testing.assert_close(c(x), m(x))


def test_top_level_hook_added_after_compile_is_honoured():
    torch.manual_seed(0)
    m = nn.Linear(3, 3)
    c = kiln.compile(m, backend="eager")
    x = t(2, 3)
    c(x)
    handle = m.register_forward_pre_hook(lambda mod, inp: (inp[0] * 0,))
    try:
        torch.testing.assert_close(c(x), m(x))
    finally:
        handle.remove()


def test_swapped_submodule_is_seen():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    c = kiln.compile(m, backend="eager")
    x = t(2, 3)
    c(x)
    m[1] = nn.Sigmoid()
    torch.testing.assert_close(c(x), m(x))


def test_plain_tensor_attribute_replaced_is_seen():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.offset = torch.zeros(3)

        def forward(self, x):
            return x + self.offset

    m = M()
    c = kiln.compile(m, backend="eager")
    x = t(3)
    c(x)
    m.offset = torch.ones(3)
    torch.testing.assert_close(c(x), x + 1)


def test_parameter_requires_grad_toggled():
    torch.manual_seed(0)
    m = nn.Linear(3, 3)
    c = kiln.compile(m, backend="eager")
    x = t(2, 3)
    assert c(x).requires_grad
    m.weight.requires_grad_(False)
    m.bias.requires_grad_(False)
    out = c(x)
    assert not out.requires_grad
    torch.testing.assert_close(out, m(x))


def test_closure_list_mutated_between_calls():
    scales = [1.0]

    def fn(x):
        return x * scales[0]

    c = kiln.compile(fn, backend="eager")
    x = t(3)
    c(x)
    scales[0] = 9.0
    torch.testing.assert_close(c(x), x * 9.0)


def test_method_rebound_on_instance():
    class M(nn.Module):
        def forward(self, x):
            return self.act(x)

        def act(self, x):
            return x.relu()

    m = M()
    c = kiln.compile(m, backend="eager")
    x = t(4)
    c(x)
    m.act = torch.sigmoid
    torch.testing.assert_close(c(x), torch.sigmoid(x))


def test_global_module_swapped():
    ns = {"torch": torch}
    exec("import math\ndef fn(x):\n    return x * math.pi", ns)
    c = kiln.compile(ns["fn"], backend="eager")
    x = t(3)
    c(x)

    class FakeMath:
        pi = 1.0

    ns["math"] = FakeMath
    torch.testing.assert_close(c(x), x * 1.0)


def test_tensor_input_views_and_storage_offset():
    def fn(x):
        return x * 2

    c = kiln.compile(fn, backend="eager")
    base = t(10)
    torch.testing.assert_close(c(base[:5]), base[:5] * 2)
    torch.testing.assert_close(c(base[5:]), base[5:] * 2)
    torch.testing.assert_close(c(base[::2]), base[::2] * 2)


def test_torch_nn_module_config_change_is_seen():
    """torch.nn's own modules are guarded on their configuration too (torch.compile recompiles)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.LayerNorm(4), nn.LeakyReLU(0.1))
    c = kiln.compile(m, backend="eager")
    x = t(50, 4)
    c(x)
    m[1].p = 0.0
    m[2].eps = 10.0
    m[3].negative_slope = 0.5
    torch.manual_seed(0)
    out = c(x)
    torch.manual_seed(0)
    torch.testing.assert_close(out, m(x))


@pytest.mark.allows_fallback(
    'graph_break: hooks registered after compile break the graph (torch.compile inlines hooks)')
def test_backward_hook_added_after_compile_fires():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    c = kiln.compile(m, backend="eager")
    x = t(2, 3)
    c(x).sum().backward()
    fired = []
    m[0].register_full_backward_hook(lambda mod, gin, gout: fired.append(1))
    c(x).sum().backward()
    assert fired == [1]


@pytest.mark.allows_fallback(
    'graph_break: hooks registered after compile break the graph (torch.compile inlines hooks)')
def test_global_forward_hook_registered_after_compile_runs():
    from torch.nn.modules.module import register_module_forward_hook

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    c = kiln.compile(m, backend="eager")
    x = t(2, 3)
    c(x)
    seen = []
    handle = register_module_forward_hook(lambda mod, inp, out: seen.append(type(mod).__name__))
    try:
        torch.testing.assert_close(c(x), m(x))
    finally:
        handle.remove()
    assert seen.count("Linear") == 2  # compiled and eager call each ran the hook


def test_id_of_an_argument_is_guarded():
    class Obj:
        pass

    def fn(x, o):
        return x * (id(o) % 7 + 1)

    c = kiln.compile(fn, backend="eager")
    x = t(3)
    a, b = Obj(), Obj()
    torch.testing.assert_close(c(x, a), fn(x, a))
    torch.testing.assert_close(c(x, b), fn(x, b))


def test_second_method_rebound_on_instance():
    """Two class attributes read off one object: each has its own not-shadowed guard."""
    class M(nn.Module):
        def forward(self, x):
            return self.shift(self.act(x))  # `shift` is read first

        def act(self, x):
            return x.relu()

        def shift(self, x):
            return x + 1

    m = M()
    c = kiln.compile(m, backend="eager")
    x = t(4)
    c(x)
    m.act = torch.sigmoid
    torch.testing.assert_close(c(x), torch.sigmoid(x) + 1)


class PlainConfig:
    def __init__(self, scale=2.0):
        self.scale = scale


class MappedConfig(PlainConfig):
    """Like transformers' PretrainedConfig: reads run Python code that maps aliases to attributes."""

    attribute_map = {"factor": "scale"}

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


class ConfiguredLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config

    def forward(self, x):
        return x * self.config.scale + getattr(self.config, "factor", 0.0)


def shared_config_layers(config_cls):
    """Three layers holding one config object (as transformers' layers do)."""
    config = config_cls()
    return config, nn.Sequential(*(ConfiguredLayer(config) for _ in range(3)))


@pytest.mark.parametrize("config_cls", [PlainConfig, MappedConfig])
@pytest.mark.parametrize("change", ["shared value", "own config", "own equal config", "own config, then shared value"])
def test_layers_sharing_one_config(config_cls, change):
    config, m = shared_config_layers(config_cls)
    c = kiln.compile(m, backend="eager")
    x = t(3)
    torch.testing.assert_close(c(x), m(x))
    if change.startswith("own"):
        m[2].config = config_cls(2.0 if change == "own equal config" else 7.0)
        torch.testing.assert_close(c(x), m(x))
    if change.endswith("shared value"):
        config.scale = 5.0
        torch.testing.assert_close(c(x), m(x))
    records = len(context_of(c).records)
    assert records == {"own equal config": 1, "own config, then shared value": 3}.get(change, 2), records


def test_module_reached_twice():
    """One Linear at two positions: its guards are checked once; a hook on it or a swap is still seen."""
    torch.manual_seed(0)
    lin = nn.Linear(3, 3)
    m = nn.Sequential(lin, nn.ReLU(), lin)
    c = kiln.compile(m, backend="eager")
    x = t(2, 3)
    torch.testing.assert_close(c(x), m(x))
    handle = lin.register_forward_hook(lambda mod, inp, out: out * 100)
    try:
        torch.testing.assert_close(c(x), m(x))
    finally:
        handle.remove()
    lin.weight.requires_grad_(False)
    torch.testing.assert_close(c(x), m(x))
    m[2] = nn.Linear(3, 3)
    torch.testing.assert_close(c(x), m(x))


class TiedLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x).relu())


@pytest.mark.parametrize("change", ["untie", "requires_grad", "strides"])
def test_tied_weight_changes_are_seen(change):
    torch.manual_seed(0)
    m = TiedLinears()
    c = kiln.compile(m, backend="eager")
    x = t(2, 3)
    torch.testing.assert_close(c(x), m(x))
    if change == "untie":
        m.b.weight = nn.Parameter(torch.randn(3, 3))
    elif change == "requires_grad":
        m.a.weight.requires_grad_(False)
    else:
        with torch.no_grad():
            m.a.weight.data = torch.randn(3, 3)[:, :3].T  # same shape, transposed strides
    torch.testing.assert_close(c(x), m(x))
    assert len(context_of(c).records) == 2
