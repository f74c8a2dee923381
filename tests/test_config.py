"""kiln.config's compile options: one frozen CompileOptions built from the OPTIONS table, documented, checked.

Every option has a type, a default and a description; the same table makes the dataclass, the list that
`kiln.list_options()` prints and the options part of `help(kiln.compile)`, so none of them can drift.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import kiln
from kiln.backends import resolve_backend
from kiln.config import (
    MODES,
    OPTIONS,
    CompileOptions,
    as_options,
    describe_options,
    field_name,
    list_options,
    validate_options,
)

# ----------------------------------------------------------------------------- defaults


def test_defaults_come_from_the_option_table():
    options = CompileOptions()
    for name, opt in OPTIONS.items():
        assert getattr(options, field_name(name)) == opt.default
    assert validate_options(None, None) == options == as_options(None) == as_options({})


def test_every_way_into_the_default_backend_gets_the_same_options():
    """kiln.compile binds the validated options; torch.compile calls kiln.inductor with none. Both see the
    table's defaults (shape padding on, as in torch)."""
    bound = resolve_backend("inductor", None, None).options
    assert bound == as_options(None)
    assert bound.shape_padding is True and OPTIONS["shape_padding"].default is True


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_mode_sets_its_options_and_options_override_it(mode):
    options = validate_options(mode, None)
    for name, value in MODES[mode].items():
        assert getattr(options, field_name(name)) == value
    flipped = {name: not value for name, value in MODES[mode].items()}
    overridden = validate_options(mode, flipped)
    assert overridden.as_dict() == {**validate_options(None, None).as_dict(), **flipped}


# ----------------------------------------------------------------------------- documentation


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_every_option_is_documented(name):
    opt = OPTIONS[name]
    assert len(opt.doc.split()) >= 5, name
    (held,) = [f for f in dataclasses.fields(CompileOptions) if f.name == field_name(name)]
    assert held.metadata["option"] == name and held.metadata["doc"] == opt.doc
    assert f"{name}: {opt.type_name} = {opt.default!r}" in str(list_options())
    assert f"{name}: {opt.type_name} = {opt.default!r}" in kiln.compile.__doc__
    assert opt.doc.split()[0] in CompileOptions.__doc__


def test_list_options_is_the_names_and_prints_a_table():
    names = kiln.list_options()
    assert names == sorted(OPTIONS) and all(isinstance(n, str) for n in names)  # torch's list_options: names
    text = repr(names)
    assert text == str(names) == describe_options(sorted(OPTIONS))
    assert "cpu_backend: str | None = None" in text and "shape_padding: bool = True" in text
    assert text.count("\n    ") >= len(OPTIONS)  # a description under each option


def test_help_of_compile_documents_every_argument_mode_and_backend():
    doc = kiln.compile.__doc__
    for argument in ("model", "fullgraph", "dynamic", "backend", "mode", "options", "disable"):
        assert f"        {argument} (" in doc, argument
    for mode in MODES:
        assert f'"{mode}"' in doc, mode
    builtin = ("inductor", "eager", "aot_eager", "cudagraphs")  # other tests register more
    assert set(builtin) <= set(kiln.list_backends())
    for backend in builtin:
        assert f'"{backend}"' in doc, backend
    assert "Raises:" in doc and "Returns:" in doc


# ----------------------------------------------------------------------------- frozen


def test_options_are_frozen_and_replacing_one_is_checked():
    options = validate_options(None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.max_autotune = True
    assert dataclasses.replace(options, max_autotune=True).max_autotune is True
    assert options.max_autotune is False
    with pytest.raises(TypeError, match="option 'max_autotune' must be bool"):
        dataclasses.replace(options, max_autotune="yes")


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("options, error, message", [
    ({"max_autotun": True}, ValueError, r"unknown option 'max_autotun'; known options: .*max_autotune"),
    ({"shape_padding": 1}, TypeError, r"option 'shape_padding' must be bool, got int"),
    ({"trace.enabled": "yes"}, TypeError, r"option 'trace.enabled' must be bool, got str"),
    ({"cpu_backend": "cuda"}, ValueError, r"option 'cpu_backend' must be one of 'cpp', 'triton', got 'cuda'"),
    ({"cpu_backend": 3}, TypeError, r"option 'cpu_backend' must be str \| None, got int"),
    (["max_autotune"], TypeError, r"options must be a dict or None, got list"),
])
def test_bad_options_are_refused_when_compile_is_called_naming_the_option(options, error, message):
    with pytest.raises(error, match=message):
        validate_options(None, options)
    with pytest.raises(error, match=message):
        kiln.compile(torch.sin, options=options)  # at the call, not at the first run
    with pytest.raises(error, match=message):
        kiln.inductor(torch.fx.symbolic_trace(lambda x: x + 1), [torch.randn(2)], options)


@pytest.mark.parametrize("mode, error, message", [
    ("max-autotune-everything", ValueError, r"unknown mode 'max-autotune-everything'; known modes: .*reduce-overhead"),
    (3, TypeError, r"mode must be a str or None, got int"),
])
def test_bad_modes_are_refused_naming_the_mode(mode, error, message):
    with pytest.raises(error, match=message):
        kiln.compile(torch.sin, mode=mode)


def test_cpu_backend_is_an_option_kiln_compile_accepts():
    assert validate_options(None, {"cpu_backend": "triton"}).cpu_backend == "triton"
    assert validate_options(None, {"cpu_backend": None}).cpu_backend is None
