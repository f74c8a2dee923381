"""The fuzzer's `cpu-triton` device: programs made for the GPU, through kiln's Triton target, interpreted on the CPU.

Its seeds below are programs the Triton target got wrong where the C++ target was right: without a GPU, only
this device sees them.
"""
import pytest

import kiln.pipeline
from kiln.codegen import triton as triton_target
from tests.fuzz.compare import check_program
from tests.fuzz.programs import generate
from tests.fuzz.targets import TRITON_ON_CPU, program_device

pytestmark = pytest.mark.skipif(not triton_target.interpreting(), reason="needs TRITON_INTERPRET=1")

TRITON_SEEDS = {
    445128: "a sum over an empty dim read its input at a constant index, unmasked (past the buffer)",
    446164: "int32 + (1 << 40): Triton refused the literal, where eager adds it wrapped to int32 (0)",
    450200: "the gradient of an empty slice loaded the empty gradient at index 0, unmasked (a segfault)",
}


@pytest.fixture
def targets_chosen(monkeypatch) -> list[str]:
    """The name of every target kiln picks for a graph during the test."""
    chosen = []

    def recording(*args, **kwargs):
        target = select(*args, **kwargs)
        chosen.append(target.name)
        return target

    select = kiln.pipeline.select_target
    monkeypatch.setattr(kiln.pipeline, "select_target", recording)
    return chosen


@pytest.mark.parametrize("seed", TRITON_SEEDS)
def test_seed_agrees_with_eager_through_triton_kernels(seed, targets_chosen):
    check_program(generate(seed, program_device(TRITON_ON_CPU)), "inductor", TRITON_ON_CPU)
    assert targets_chosen and set(targets_chosen) == {"triton"}
