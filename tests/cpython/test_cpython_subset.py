"""A fast subset of CPython's own tests through kiln (tests/cpython/harness.py; the whole run is
`python -m tests.cpython`, its table in benchmarks/results/cpython_tests.md).

Each test method is compiled with kiln (backend="eager") and must end as its plain run ends. The subset
holds tests that found capture bugs (a list iterator read live, `super()` kept across a break, dict
subclasses' own `__getitem__`, and those listed below) beside everyday ones from each file; under
KILN_STRICT=1 a capture that fails and runs the frame eagerly is an error here.
"""
from __future__ import annotations

import unittest

import pytest

from .harness import ensure_stdlib_tests, kiln_wrapper, run_one, stdlib_tests_installed

SUBSET = [
    "test_list.ListTest.test_exhausted_iterator",
    "test_list.ListTest.test_extend",
    "test_list.ListTest.test_contains_order",
    pytest.param("test_sort.TestOptimizedCompares.test_safe_object_compare",
                 marks=pytest.mark.allows_fallback("frame_limit: assertRaises meets more than 8 callables and "
                                                   "reaches cache_size_limit, as torch.compile's recompile limit")),
    "test_sort.TestBase.test_stability",
    "test_dict.DictTest.test_setdefault",
    "test_dict.DictTest.test_missing",
    "test_dict.DictTest.test_update",
    "test_iter.TestCase.test_iter_dict",
    "test_generators.ExceptionTest.test_return_tuple",
    "test_functools.TestPartialPy.test_basic_examples",
    "test_functools.TestReduceC.test_reduce",
    "test_operator.PyOperatorTestCase.test_add",
    "test_math.MathTests.testFloor",
    # found by this harness, each a class of fixes with its own tests under tests/capture/
    "test_contextlib.TestSuppress.test_exact_exception",
    "test_contextlib.ContextManagerTestCase.test_contextmanager_doc_attrib",
    "test_functools.TestWraps.test_default_update",
    "test_list.ListTest.test_reversed_pickle",
    "test_itertools.SizeofTest.test_combinations_sizeof",
    "test_dict.GeneralMappingTests.test_write",
    "test_set.TestFrozenSet.test_constructor_identity",
    "test_collections.TestChainMap.test_basics",
    pytest.param("test_functools.TestLRUPy.test_lru_with_types",
                 marks=pytest.mark.allows_fallback("frame: cache_info's `with lock:` over an RLock, a context "
                                                   "manager kiln does not model, runs natively")),
    "test_list.ListTest.test_overflow",
    "test_operator.PyOperatorTestCase.test_contains",
    "test_functools.TestPartialC.test_positional",
    "test_functools.TestPartialMethod.test_bound_method_introspection",
    "test_collections.TestNamedTuple.test_name_conflicts",
    "test_set.TestSubsetPartial.test_issubset",
    "test_builtin.BuiltinTest.test_getattr",
]


def _case(test_id: str) -> unittest.TestCase:
    if not stdlib_tests_installed():
        pytest.skip("this interpreter ships without CPython's Lib/test files")
    ensure_stdlib_tests()
    (case,) = list(unittest.defaultTestLoader.loadTestsFromName(f"test.{test_id}"))
    return case


@pytest.mark.parametrize("test_id", SUBSET)
def test_cpython_test_ends_as_its_plain_run(test_id):
    case = _case(test_id)
    plain, _ = run_one(case, None)
    wrap, failed_capture = kiln_wrapper()
    failed_capture()
    compiled, detail = run_one(case, wrap)
    assert not failed_capture()
    assert compiled == plain, detail
