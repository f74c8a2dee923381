"""The fuzzer in CI: fixed seeds per backend, each program compared with eager (see compare.py).

A failure prints the program and its seed; replay it with `python -m tests.fuzz --replay SEED --backend B`
and shrink it with `--minimize SEED`. Longer runs: `python -m tests.fuzz --programs 2000 --workers 16`.

SEEDS pass today. KNOWN_FAILING are seeds the fuzzer found failing, by the class of bug (issue 21):
they run only with KILN_FUZZ_KNOWN=1, and move to SEEDS when their class is fixed.
"""
from __future__ import annotations

import os

import pytest
import torch

from tests.fuzz.compare import check_program, run_program
from tests.fuzz.programs import generate

# chosen among seeds that pass to cover each feature of the generator (grads, graph breaks, state, rank
# changes, aliasing inputs, edge integers, bf16...) at least three times, the smallest programs first
COVERING = [0, 2, 26, 31, 37, 42, 43, 55, 65, 75, 84, 85, 93, 95, 100, 134, 143, 149, 182, 183, 195, 203, 206,
            207, 208, 211, 214, 223, 260, 285, 290, 295]
SEEDS = {
    "eager": COVERING,
    "aot_eager": COVERING,
    "inductor": COVERING[::3],  # C++ builds dominate: a third of them keeps the file within its time budget
}

KNOWN_FAILING = {
    "eager": {},
    "aot_eager": {},
    "inductor": {},
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny programs: OpenMP threads only contend on a shared CI machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("backend,seed", [(b, s) for b, seeds in SEEDS.items() for s in seeds])
def test_seed(backend, seed):
    check_program(generate(seed), backend)


@pytest.mark.skipif(not os.environ.get("KILN_FUZZ_KNOWN"), reason="known failing seeds: set KILN_FUZZ_KNOWN=1")
@pytest.mark.parametrize("backend,seed", [(b, s) for b, seeds in KNOWN_FAILING.items() for s in seeds])
def test_known_failing_seed(backend, seed):
    check_program(generate(seed), backend)


def test_generator_is_deterministic():
    """A seed names one program: the failure a CI run prints replays anywhere."""
    assert generate(7) == generate(7)
    assert generate(7) != generate(8)


def test_harness_sees_a_wrong_value():
    """The comparison is not vacuous: a backend that perturbs a value is reported wrong, with the program."""
    def off_by_one(gm, example_inputs):
        return lambda *args: [o + 1 if isinstance(o, torch.Tensor) and o.dtype.is_floating_point else o
                              for o in gm(*args)]
    source = ("CALLS = 1\nDYNAMIC = None\nNO_GRAD = False\n"
              "def inputs(call):\n    return [torch.ones(3)]\n"
              "def f(a):\n    return a * 2\n")
    assert run_program(source, off_by_one).status == "wrong"
