"""CPython's own tests through a compiler: each test method's body compiled, its outcome compared with a plain run.

PyTorch runs CPython's test files under torch.compile (test/dynamo/cpython/3_13/ in its repository: each file
patched so that its TestCase compiles the test method with backend="eager"). This harness does the same with
the interpreter's own `Lib/test`, unpatched: it loads a stdlib test module, and for every test method runs

- plainly (the reference outcome: pass, fail, error, skip, expected failure, unexpected success);
- with the method compiled by kiln (`backend="eager"`, so only capture is under test);
- with the method compiled by torch.compile (`backend="eager"`), for comparison.

setUp and tearDown run uncompiled, as in PyTorch's harness. A compiled run passes when its outcome is the plain
run's. For kiln a capture that fails and runs the frame eagerly (a `frame` fallback at capture, which hides
the failure from the outcome) is counted as not passing, so that a crash in capture cannot pass for success.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
import sysconfig
import unittest
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from support.time_limit import TimeLimitExceeded, time_limit

FILES = ("test_builtin", "test_collections", "test_contextlib", "test_dict", "test_list", "test_set",
         "test_generators", "test_iter", "test_itertools", "test_operator", "test_functools", "test_dataclasses",
         "test_math", "test_sort")
COMPILERS = ("kiln", "torch")
SECONDS_PER_TEST = 60  # a hung capture costs one test, not the file


@dataclass
class TestOutcome:
    test: str
    plain: str
    compiled: dict[str, str] = field(default_factory=dict)  # compiler -> outcome
    notes: dict[str, str] = field(default_factory=dict)  # compiler -> why it differs

    def passed(self, compiler: str) -> bool:
        return self.compiled.get(compiler) == self.plain


@dataclass
class FileResult:
    file: str
    outcomes: list[TestOutcome] = field(default_factory=list)

    def passes(self, compiler: str) -> int:
        return sum(o.passed(compiler) for o in self.outcomes)


class _Outcomes(unittest.TestResult):
    """The one outcome of a single test run (a method's subtests count as one: the worst of them)."""

    RANK = ("pass", "skip", "expected failure", "unexpected success", "fail", "error")

    def __init__(self):
        super().__init__()
        self.outcome, self.detail = "pass", ""

    def _set(self, outcome: str, detail: str = "") -> None:
        if self.RANK.index(outcome) > self.RANK.index(self.outcome):
            self.outcome, self.detail = outcome, detail

    def addError(self, test, err):
        self._set("error", _describe(err))

    def addFailure(self, test, err):
        self._set("fail", _describe(err))

    def addSkip(self, test, reason):
        self._set("skip", reason)

    def addExpectedFailure(self, test, err):
        self._set("expected failure")

    def addUnexpectedSuccess(self, test):
        self._set("unexpected success")

    def addSubTest(self, test, subtest, err):
        if err is not None:
            self._set("fail" if issubclass(err[0], test.failureException) else "error", _describe(err))


def _describe(err) -> str:
    text = f"{err[0].__name__}: {err[1]}".strip()
    return text.splitlines()[0][:200] if text else err[0].__name__


def load_tests(file: str) -> list[unittest.TestCase]:
    """The test cases of stdlib module `test.<file>` (a package such as test_dataclasses too), in order."""
    module = importlib.import_module(f"test.{file}")
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    cases = []

    def flatten(item):
        if isinstance(item, unittest.TestSuite):
            for sub in item:
                flatten(sub)
        elif isinstance(item, unittest.TestCase) and hasattr(item, "_testMethodName"):
            cases.append(item)

    flatten(suite)
    return cases


def run_one(case: unittest.TestCase, wrap: Callable | None) -> tuple[str, str]:
    """Run `case` once, its test method wrapped by `wrap` (None: plainly): (outcome, detail)."""
    name = case._testMethodName
    original = case.__dict__.get(name)
    if wrap is not None:
        setattr(case, name, wrap(getattr(case, name)))
    result = _Outcomes()
    try:
        with time_limit(SECONDS_PER_TEST), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            case.run(result)
    except TimeLimitExceeded as exc:
        result._set("error", f"timeout: {exc}")
    finally:
        if original is None:
            case.__dict__.pop(name, None)
        else:
            setattr(case, name, original)
    return result.outcome, result.detail


def kiln_wrapper() -> tuple[Callable, Callable[[], str]]:
    """kiln.compile(method, backend="eager"), and a probe saying whether a capture failed since the last probe."""
    import kiln
    from kiln import fallbacks

    def wrap(method):
        kiln.reset()
        return kiln.compile(method, backend="eager")

    def failed_capture() -> str:
        failures = [f for f in fallbacks.records() if f.kind == "frame" and f.stage == "capture"]
        fallbacks.reset()
        return f"capture failed, ran eagerly: {failures[0].cause}"[:200] if failures else ""

    return wrap, failed_capture


def torch_wrapper() -> tuple[Callable, Callable[[], str]]:
    import torch
    import torch._dynamo

    def wrap(method):
        torch._dynamo.reset()
        return torch.compile(method, backend="eager")

    return wrap, lambda: ""


WRAPPERS = {"kiln": kiln_wrapper, "torch": torch_wrapper}


def run_file(file: str, compilers=COMPILERS, only: Callable[[str], bool] | None = None,
             progress: Callable[[TestOutcome], None] | None = None) -> FileResult:
    os.environ["KILN_STRICT"] = "0"  # a failed capture is counted (see the module docstring), not raised
    wrappers = {c: WRAPPERS[c]() for c in compilers}
    result = FileResult(file)
    for case in load_tests(file):
        test = case.id().removeprefix("test.")
        if only is not None and not only(test):
            continue
        plain, _ = run_one(case, None)
        outcome = TestOutcome(test, plain)
        for compiler, (wrap, failed_capture) in wrappers.items():
            failed_capture()
            outcome.compiled[compiler], detail = run_one(case, wrap)
            failure = failed_capture()
            if failure and outcome.compiled[compiler] == plain:
                outcome.compiled[compiler] = "capture failed"
            if not outcome.passed(compiler):
                outcome.notes[compiler] = failure or detail
        result.outcomes.append(outcome)
        if progress:
            progress(outcome)
    return result


def summarize(results: list[FileResult], compilers=COMPILERS) -> str:
    """The Markdown table: per file, tests and passes per compiler; then the totals."""
    lines = ["| file | tests | " + " | ".join(f"{c} passes" for c in compilers) + " |",
             "|---|---|" + "---|" * len(compilers)]
    totals = Counter()
    for r in results:
        totals["tests"] += len(r.outcomes)
        cells = []
        for c in compilers:
            totals[c] += r.passes(c)
            cells.append(f"{r.passes(c)} ({100 * r.passes(c) / max(len(r.outcomes), 1):.0f}%)")
        lines.append(f"| {r.file} | {len(r.outcomes)} | " + " | ".join(cells) + " |")
    cells = [f"{totals[c]} ({100 * totals[c] / max(totals['tests'], 1):.1f}%)" for c in compilers]
    lines.append(f"| **all** | {totals['tests']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def stdlib_tests_installed() -> bool:
    """Whether this interpreter has its Lib/test files: some distributions ship `test` without them (Debian's
    python3.12 keeps only `test.support` unless its testsuite package is installed)."""
    module = importlib.import_module("test")
    folder = os.path.dirname(module.__file__)
    in_stdlib = os.path.commonpath([folder, sysconfig.get_paths()["stdlib"]]) == sysconfig.get_paths()["stdlib"]
    return not in_stdlib or os.path.exists(os.path.join(folder, "test_builtin.py"))


def ensure_stdlib_tests() -> None:
    """`test` must be the standard library's test package (not a tests/ folder on sys.path)."""
    module = importlib.import_module("test")
    if not os.path.exists(os.path.join(os.path.dirname(module.__file__), "test_builtin.py")):
        raise RuntimeError(f"`test` resolves to {module.__file__}, not CPython's Lib/test")
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))
