"""Loaded before any test module: decide where Triton kernels run before anything imports triton.

Triton reads TRITON_INTERPRET when its own library functions (`tl.zeros`, ...) are decorated, at its
import. Test modules that use torch.compile as the reference import triton through torch, so the
decision in `triton_device` must be made here, ahead of every module, not in the Triton tests.
"""
import hashlib  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from support import (
    sweeps,
    triton_device,  # noqa: F401  (sets TRITON_INTERPRET on machines without a GPU)
)


def _reference_guards_untimed() -> None:
    """torch.compile, the reference many tests compare kiln with, times each guard set it builds once for a debug
    log line and a metric (torch/_dynamo/guards.py, `profile_guard_manager`), flushing the CPU's caches first:
    tens of milliseconds per compiled frame, more than the rest of the reference's compile of a small function.
    No test reads that latency, so the tests' torch.compile skips the timing. Set on torch's C module before
    torch._dynamo.guards imports the name from it (kiln never imports torch._dynamo)."""
    import torch

    torch._C._dynamo.guards.profile_guard_manager = lambda root, scope, iterations: 0.0


_reference_guards_untimed()


def pytest_configure(config):
    config.addinivalue_line("markers", "allows_fallback(why): the test makes kiln fall back on purpose (runs with "
                                       "KILN_STRICT=0); `why` names the fallback")
    config.addinivalue_line("markers", "sampled(every, classes): CI runs a diagonal sample of the test's parameter "
                                       "matrix, about one case in `every`, each value of the `classes` parameters kept "
                                       "(tests/support/sweeps.py); KILN_MATRIX_SWEEP=1 runs it whole")


@pytest.fixture(autouse=True)
def kiln_strict(request, monkeypatch):
    """Tests run strict (KILN_STRICT=1: a kiln fallback is an error, kiln/fallbacks.py) unless the environment
    says otherwise or the test is marked `allows_fallback` (it exercises a fallback on purpose). Each test
    starts with no fallback recorded or warned about, with the graph cache off, and with no compile context
    shared with another test's."""
    import kiln
    from kiln import fallbacks

    # Tests read what the stages made (the IR, the schedule), which a graph from the compile cache lacks; the
    # warm-start tests (tests/runtime/test_cache_warm.py) turn it on over a cache of their own.
    monkeypatch.setattr(kiln.config, "graph_cache", False)
    # kiln.compile calls naming one backend share their captures, as torch.compile's do (kiln.api); those of one
    # test share, and not with another test's, as torch's own tests call torch._dynamo.reset() between them
    monkeypatch.setattr(kiln.api, "_shared_contexts", {})
    if request.node.get_closest_marker("allows_fallback") is not None:
        monkeypatch.setenv("KILN_STRICT", "0")
    else:
        monkeypatch.setenv("KILN_STRICT", os.environ.get("KILN_STRICT", "1"))
    fallbacks.reset()


@pytest.fixture(autouse=True)
def seeded(request):
    """Each test starts torch's and Python's generators from a seed of its own, made from its id: the random
    inputs of a test that does not seed them are the same on every run and every worker, so a tolerance that
    unlucky values exceed fails always or never, not once in some runs (and a failure replays by its id)."""
    import torch

    seed = int.from_bytes(hashlib.sha256(command_line_id(request.node).encode()).digest()[:4], "little")
    torch.manual_seed(seed)
    random.seed(seed)


def command_line_id(item) -> str:
    """The test's id as a command line names it: xdist's `--dist loadgroup` appends "@" and the group to the ids
    of the tests it keeps on one worker (`share_module_fixtures`), which a run without xdist does not."""
    nodeid = item.nodeid
    for mark in item.iter_markers("xdist_group"):
        suffix = f"@{mark.args[0] if mark.args else mark.kwargs.get('name', 'default')}"
        if nodeid.endswith(suffix):
            return nodeid[:-len(suffix)]
    return nodeid


@pytest.fixture(autouse=True)
def debug_dir_outside_the_checkout(monkeypatch, tmp_path_factory):
    """What kiln writes to its debug directory unasked (a crashing backend's repro, kiln/debug/minifier) goes to
    a temporary directory, not ./kiln_debug in the checkout. A test that reads KILN_DEBUG_DIR sets
    `kiln.config.debug_dir` back to None (the setting overrides the variable)."""
    import kiln

    monkeypatch.setattr(kiln.config, "debug_dir", str(tmp_path_factory.getbasetemp() / "kiln_debug"))


@pytest.fixture
def fallback_log():
    """kiln.fallbacks, to assert on its counts() after the test's fallback."""
    from kiln import fallbacks

    return fallbacks


@pytest.fixture
def compiled_graphs():
    """The CompiledGraphs kiln's pipeline builds during the test, in order (a `GRAPH_LISTENERS` listener)."""
    from kiln.pipeline import GRAPH_LISTENERS

    seen = []

    def listener(graph, options):
        seen.append(graph)

    GRAPH_LISTENERS.append(listener)
    yield seen
    GRAPH_LISTENERS.remove(listener)


@pytest.fixture(scope="session")
def guard_extension():
    """The guards' C++ extension of this session (None where it cannot be built), built or loaded in the session's
    cache directory: a session fixture is set up before a test's own `fresh_cache` points KILN_CACHE_DIR elsewhere,
    where it would be built again. support.cache.seed_guard_extension copies it into a child process's cache."""
    from kiln.capture import tensor_checks

    return tensor_checks.wait()


@pytest.fixture
def fresh_cache(guard_extension, tmp_path, monkeypatch) -> Path:
    """An empty cache directory of this test's, with the compile cache (graphs, AOT autograd) on, and no memory of
    earlier refusals, loaded libraries or used files. The guards' extension stays the session's (`guard_extension`):
    a first compile under this cache does not build it there again, nor with a compiler the test stands in."""
    from kiln.config import config
    from kiln.runtime import cache
    from kiln.runtime.private_files import PrivateTree

    root = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(root))
    monkeypatch.setattr(cache, "_tree", PrivateTree("cache"))
    monkeypatch.setattr(cache, "_loaded", {})
    monkeypatch.setattr(cache, "_used", {})
    monkeypatch.setattr(config, "graph_cache", True)
    return root


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """CI's samples of the matrices marked `sampled` (the rest deselected), then `share_module_fixtures`. First of
    the plugins' hooks: an xdist worker registers its own hook after this file is loaded (so it would run before
    this one), and that hook reads the `xdist_group` marks `share_module_fixtures` adds."""
    if not sweeps.full(sweeps.MATRIX_SWEEP):
        named = {arg for arg in config.args if "[" in arg}  # cases asked for by id run, sampled or not
        kept = sampled(items) | {item for item in items if any(arg.endswith(item.nodeid) for arg in named)}
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = [item for item in items if item in kept]
    share_module_fixtures(items)


def sampled(items) -> set:
    """The items CI runs: every unmarked one, and `sweeps.diagonal`'s sample of each test marked `sampled`, whose
    matrix has one axis per `parametrize`."""
    matrices: dict[tuple, list] = {}
    kept = set()
    for item in items:
        if item.get_closest_marker("sampled") is None or not hasattr(item, "callspec"):
            kept.add(item)
        else:
            matrices.setdefault((item.module.__name__, item.cls, item.originalname), []).append(item)
    for members in matrices.values():
        mark = members[0].get_closest_marker("sampled")
        axes = list(members[0].iter_markers("parametrize"))
        cases = [{axis_name(axis): position(item, axis) for axis in axes} for item in members]
        kept.update(members[i] for i in sweeps.diagonal(cases, mark.kwargs.get("every", 3),
                                                        tuple(mark.kwargs.get("classes", ()))))
    return kept


def axis_name(parametrize) -> str:
    """The name of a `parametrize`'s axis: its first parameter (argnames as "a,b" or as a sequence)."""
    names = parametrize.args[0]
    return (names.split(",") if isinstance(names, str) else list(names))[0].strip()


PARAM = type(pytest.param(None))


def position(item, parametrize) -> int:
    """Where the item's value of the `parametrize`'s first parameter stands in its list of values (pytest's
    `callspec.indices` numbers the cases of the whole matrix, not the positions along each axis)."""
    values, single = parametrize.args[1], "," not in parametrize.args[0] if isinstance(parametrize.args[0], str) \
        else len(parametrize.args[0]) == 1
    value = item.callspec.params[axis_name(parametrize)]
    for k, v in enumerate(values):
        v = v.values if isinstance(v, PARAM) else (v,) if single else v
        if v[0] is value:
            return k
    raise ValueError(f"{item.nodeid}: {value!r} is not among the values of {axis_name(parametrize)}")


def share_module_fixtures(items):
    """Tests that share a module-scoped fixture run on one xdist worker (`--dist loadgroup`, scripts/test.sh): a
    module fixture is set up once per worker that runs one of its tests, and those of the warm-start and cache
    tests run whole processes that compile models."""
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        if defs is not None and any(d.scope == "module" for fixture_defs in defs.name2fixturedefs.values()
                                    for d in fixture_defs):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
