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

SEEDS = {
    "eager": [],
    "aot_eager": [],
    "inductor": [],
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
