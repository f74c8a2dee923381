"""`bytecode.global_reads(code)`: the global names a code object reads, off its raw code units (the pipeline
checks every wrapper a warm start loads for names it reads but never binds). It must name exactly what `dis`
names as LOAD_GLOBAL, for every shape of code: calls (which push NULL), plain reads, name indices past 255 (an
EXTENDED_ARG prefix), and not the reads of the functions defined inside it."""
from __future__ import annotations

import dis
import textwrap

import pytest

from kiln import pipeline
from kiln.capture import bytecode
from kiln.capture import entry as capture_entry
from kiln.codegen import wrapper


def _by_dis(code) -> list[str]:
    return list(dict.fromkeys(i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"))


def _function_code(source: str, name: str = "f"):
    module = compile(textwrap.dedent(source), "<test>", "exec")
    return next(c for c in module.co_consts if getattr(c, "co_name", None) == name)


CASES = {
    "calls_and_reads": """
        def f(x):
            y = helper(x) + CONSTANT
            return torch.relu(y) if flag else len(y)
        """,
    "attribute_names_are_not_globals": """
        def f(x):
            return x.stride(0) + x.data_ptr() + other.mm
        """,
    "nested_function_reads_are_its_own": """
        def f(x):
            def inner():
                return only_inside(x)
            return outer(inner)
        """,
    "many_names_need_extended_args": "def f():\n    return [" + ", ".join(
        f"name_{i}" if i % 2 else f"call_{i}()" for i in range(600)) + "]\n",
    "globals_after_many_attributes": "def f(x):\n    " + "\n    ".join(
        f"x.attr_{i}" for i in range(300)) + "\n    return late_global + late_call()\n",
}


@pytest.mark.parametrize("case", CASES)
def test_global_reads_match_dis(case):
    code = _function_code(CASES[case])
    assert bytecode.global_reads(code) == _by_dis(code)


def test_global_reads_match_dis_over_real_modules():
    """Every code object of three large modules (frame entry, wrapper generator, pipeline), nested ones too."""
    def walk(code):
        yield code
        for const in code.co_consts:
            if hasattr(const, "co_code"):
                yield from walk(const)

    for module in (capture_entry, wrapper, pipeline):
        with open(module.__file__) as f:
            top = compile(f.read(), module.__file__, "exec")
        for code in walk(top):
            assert bytecode.global_reads(code) == _by_dis(code), code.co_name


def test_unbound_globals_names_a_read_nothing_binds_in_a_nested_function():
    module = compile(textwrap.dedent("""
        def call(args):
            buf = empty(3)
            return kernel_0(buf, s26)
        """), "<wrapper>", "exec")
    namespace = {"empty": object(), "kernel_0": object()}
    assert pipeline.unbound_globals(module, namespace) == ["s26 (in call)"]
    assert pipeline.unbound_globals(module, dict(namespace, s26=3)) == []
