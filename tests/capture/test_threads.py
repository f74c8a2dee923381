"""Compiled code called from many threads at once, as inference servers do.

The first calls race to compile: one thread compiles under the compile lock, the others wait and
then find its cache entry, so there is one compilation per distinct guard set and no error. Guards
read the calling thread's own state (grad mode, autocast are per thread in torch). A barrier makes
the threads start their first calls together.
"""
import threading

import pytest
import torch
from torch import nn

import kiln
from kiln.api import context_of
from support.capture import assert_same, break_reasons, graph_count

THREADS = 4


def run_in_threads(target, n=THREADS) -> list:
    """`target(i)` in `n` threads started together; their results in thread order. Re-raises an error."""
    barrier = threading.Barrier(n)
    results, errors = [None] * n, []

    def work(i):
        try:
            barrier.wait()
            results[i] = target(i)
        except BaseException as e:  # noqa: B036  (reported to the test below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


class CountingBackend:
    """A backend that counts its compilations (thread-safe: compiles are serialized anyway)."""

    def __init__(self, backend="eager"):
        self.calls = 0
        self.inner = backend

    def __call__(self, gm, example_inputs):
        self.calls += 1
        if self.inner == "eager":
            return gm.forward
        from kiln.backends import resolve_backend

        return resolve_backend(self.inner, None, None)(gm, example_inputs)


def sin_affine(x):
    return torch.sin(x) * 2 + 1


def cos_scale(x):
    return torch.cos(x) * 3 - x


def with_break(x):
    y = x * 2
    kiln.graph_break()
    return y.relu() + 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_first_calls_of_one_function_compile_once(backend):
    counter = CountingBackend(backend)
    compiled = kiln.compile(sin_affine, backend=counter)
    inputs = [torch.randn(8) for _ in range(THREADS)]
    results = run_in_threads(lambda i: compiled(inputs[i]))
    for x, out in zip(inputs, results):
        assert_same(sin_affine(x), out)
    assert counter.calls == 1
    assert len(context_of(compiled).records) == 1


def test_two_functions_compiled_at_once():
    functions = [sin_affine, cos_scale] * (THREADS // 2)
    counters = [CountingBackend("aot_eager") for _ in functions[:2]]
    compiled = [kiln.compile(fn, backend=c) for fn, c in zip(functions[:2], counters)] * (THREADS // 2)
    inputs = [torch.randn(5, 3) for _ in range(THREADS)]
    results = run_in_threads(lambda i: compiled[i](inputs[i]))
    for fn, x, out in zip(functions, inputs, results):
        assert_same(fn(x), out)
    assert [c.calls for c in counters] == [1, 1]


def test_module_called_from_threads():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 3))
    counter = CountingBackend("aot_eager")
    compiled = kiln.compile(model, backend=counter)
    inputs = [torch.randn(4, 6) for _ in range(THREADS)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    results = run_in_threads(lambda i: compiled(inputs[i]).detach())
    for e, out in zip(expected, results):
        assert_same(e.detach(), out)
    assert counter.calls == 1


def test_continuation_after_a_break_compiles_once():
    counter = CountingBackend()
    compiled = kiln.compile(with_break, backend=counter)
    inputs = [torch.randn(7) for _ in range(THREADS)]
    results = run_in_threads(lambda i: compiled(inputs[i]))
    for x, out in zip(inputs, results):
        assert_same(with_break(x), out)
    ctx = context_of(compiled)
    assert counter.calls == graph_count(ctx) == 2
    assert break_reasons(ctx) == ["explicit"]


def test_many_threads_never_exceed_the_cache():
    """Concurrent first calls with one guard set make one entry, not one per thread (cache_size_limit)."""
    compiled = kiln.compile(sin_affine, backend="eager")
    inputs = [torch.randn(3) for _ in range(12)]
    run_in_threads(lambda i: compiled(inputs[i]), n=12)
    (frame,) = context_of(compiled).frames.values()
    assert len(frame.entries) == 1 and not frame.run_eagerly


def test_one_compile_per_distinct_guard_set():
    """Two input shapes, two threads each (static shapes): one entry per shape, whichever thread comes first."""
    counter = CountingBackend()
    compiled = kiln.compile(sin_affine, backend=counter, dynamic=False)
    inputs = [torch.randn(3 + 2 * (i % 2)) for i in range(THREADS)]
    results = run_in_threads(lambda i: compiled(inputs[i]))
    for x, out in zip(inputs, results):
        assert_same(sin_affine(x), out)
    assert counter.calls == 2


def test_guards_read_the_calling_threads_grad_mode():
    """Grad mode is per thread: threads with and without no_grad get their own entry and eager's requires_grad."""
    counter = CountingBackend("aot_eager")
    compiled = kiln.compile(sin_affine, backend=counter)
    inputs = [torch.randn(5, requires_grad=True) for _ in range(THREADS)]

    def call(i):
        with torch.set_grad_enabled(i % 2 == 0):
            return compiled(inputs[i]), sin_affine(inputs[i])

    for actual, expected in run_in_threads(call):
        assert_same(expected, actual)
    assert counter.calls == 2


def test_guards_read_the_calling_threads_autocast():
    counter = CountingBackend("aot_eager")
    compiled = kiln.compile(lambda a, b: a @ b + 1, backend=counter)
    a, b = torch.randn(4, 4), torch.randn(4, 4)

    def call(i):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=i % 2 == 0):
            return compiled(a, b).dtype

    assert run_in_threads(call) == [torch.bfloat16, torch.float32] * (THREADS // 2)
    assert counter.calls == 2


def test_compiled_code_runs_concurrently_from_threads():
    """After the first compile, many calls from many threads: every result is eager's."""
    compiled = kiln.compile(cos_scale)
    compiled(torch.randn(16))

    def many_calls(i):
        torch.manual_seed(i)
        for _ in range(20):
            x = torch.randn(16)
            assert_same(cos_scale(x), compiled(x))

    run_in_threads(many_calls)
    assert len(context_of(compiled).records) == 1


def test_timed_calls_keep_one_stack_of_running_programs_per_thread():
    """With timing on (`python -m kiln run`), each thread sees only its own running programs."""
    from kiln.capture.entry import instrumentation

    barrier, seen = threading.Barrier(2), []

    @kiln.disable
    def rendezvous():
        barrier.wait()  # both threads are inside their compiled program now
        seen.append(len(ctx.running))
        barrier.wait()

    def f(x):
        y = x * 2
        rendezvous()
        return y + 1

    compiled = kiln.compile(f, backend="eager")
    ctx = context_of(compiled)
    instrumentation.timing = True
    try:
        results = run_in_threads(lambda i: compiled(torch.ones(3) * i), n=2)
    finally:
        instrumentation.timing = False
    assert seen == [1, 1]
    assert ctx.running == []
    for i, out in enumerate(results):
        assert_same(torch.ones(3) * i * 2 + 1, out)
