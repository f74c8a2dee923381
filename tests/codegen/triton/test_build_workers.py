"""Triton kernels compiled in build worker processes (kiln/codegen/triton/build_workers.py).

On a GPU, a graph's kernels are compiled first in worker processes, into Triton's on-disk cache, and then loaded in
the graph's process, which must find every one of them there: a kernel compiled twice costs what the workers were
meant to save. A kernel that fails in a worker fails again in the graph's process, where it falls back to ATen.

The test process runs Triton's interpreter, so the workers are checked from a child process that compiles for
sm_90 behind a driver that only names the target (as tests/support/triton_sm90.py does): no GPU needed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from kiln.codegen import triton as triton_target  # noqa: E402
from kiln.codegen.triton import build_workers  # noqa: E402
from kiln.codegen.triton.launch import Launcher  # noqa: E402
from support.lowering import trace  # noqa: E402
from support.triton_device import DEVICE, skip_unless_kernels_run  # noqa: E402
from support.triton_sm90 import DOUBLING_KERNEL  # noqa: E402

KERNELS = triton_target.HEADER + DOUBLING_KERNEL + '''


@triton.jit
def triton_broken(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    tl.store(out_ptr0 + tl.arange(0, XBLOCK), name_that_is_not_defined, xnumel > 0)


_launch_triton_broken = Launcher(triton_broken, 2, num_warps=4, XBLOCK=1024)
'''

CHILD = textwrap.dedent('''
    import json, sys, tempfile, time
    import triton
    import triton.compiler.compiler as triton_compiler
    from triton.backends.compiler import GPUTarget
    from kiln.codegen.triton import build_worker_process, build_workers, load_module

    target = GPUTarget("cuda", 90, 32)
    triton.runtime.driver.set_active(build_worker_process.TargetOnlyDriver(target))
    triton.knobs.cache.dir = tempfile.mkdtemp()
    module = load_module(sys.stdin.read())
    requests = [{"path": module.__file__, "module": module.__name__, "launcher": launcher, "dtypes": [dtype] * 2,
                 "ints": [4096]} for launcher, dtype in [("_launch_triton_double", "float32"),
                                                          ("_launch_triton_double", "bfloat16"),
                                                          ("_launch_triton_broken", "float32")]]
    workers = build_workers.BuildWorkers(2, [target.backend, target.arch, target.warp_size], triton.knobs.cache.dir)
    not_ready = workers.build(requests)  # none has imported torch and Triton yet: the caller compiles
    while workers.ready() < 2:
        time.sleep(0.05)
    compiled_here = []
    in_workers = workers.build(requests, compiled_here.append)  # every worker ready: the caller compiles none
    workers.close()
    from pathlib import Path
    launchers = sorted({p.parent.name for p in Path(triton.knobs.cache.dir).rglob("__triton_launcher*")})
    front_end_runs = []
    make_ir = triton_compiler.ASTSource.make_ir
    triton_compiler.ASTSource.make_ir = lambda self, *a: front_end_runs.append(self.name) or make_ir(self, *a)
    here = {}
    for k, request in enumerate(requests):
        try:
            build_worker_process.compile_request(request, {module.__file__: module})
        except Exception as e:
            here[k] = type(e).__name__
    print(json.dumps({"not_ready": not_ready, "in_workers": in_workers, "compiled_here": compiled_here,
                      "front_end_runs": front_end_runs,
                      "here": here, "launchers_from_workers": len(launchers)}))
''')


def test_kernels_built_in_workers_are_not_compiled_again():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(build_workers.__file__).parents[3]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", CHILD], input=KERNELS, capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["not_ready"] == {}, result
    assert result["compiled_here"] == [], result  # with workers ready, the graph's process left them every request
    errors = {int(k): v for k, v in result["in_workers"].items()}
    assert errors[0] is None and errors[1] is None, errors  # one kernel, two specializations (dtypes)
    assert "name_that_is_not_defined" in errors[2], errors
    # the graph's process found both specializations in Triton's cache; only the broken kernel went through
    # Triton's front end again, and failed again (it falls back to ATen there)
    assert result["front_end_runs"] == ["triton_broken"], result
    assert result["here"] == {"2": "CompilationError"}, result
    # with a CUDA driver on the machine the workers also built the C launcher of the kernel's signature (one for
    # both dtypes: pointers and an int), which the graph's process would otherwise build on its first load
    assert result["launchers_from_workers"] == (1 if torch.cuda.is_available() else 0), result


def test_requests_name_each_launcher_compile_of_generated_kernels(monkeypatch):
    """One request per `Launcher.precompile` a graph's kernels make (a split reduction makes two), each naming a
    launcher of the module with plain dtypes and integers."""
    loaded = []
    real = triton_target.precompile_all
    monkeypatch.setattr(triton_target, "precompile_all",
                        lambda module, kernels, device="cpu": loaded.append((module, kernels)) or
                        real(module, kernels, device))

    def fn(x, y):
        return (x * y).sum(), (x + y).relu(), x.sum(0)

    skip_unless_kernels_run()
    x, y = torch.randn(4096, 64, device=DEVICE), torch.randn(4096, 64, device=DEVICE)
    from kiln.pipeline import compile_aten_graph

    compile_aten_graph(trace(fn, x, y), [x, y], {"cpu_backend": "triton"})
    (module, kernels), = loaded
    requests = build_workers.requests_for(module, kernels)
    assert len(requests) >= len(kernels)
    for request in requests:
        assert request["path"] == module.__file__ and request["module"] == module.__name__
        assert isinstance(getattr(module, request["launcher"]), Launcher)
        assert all(isinstance(getattr(torch, d), torch.dtype) for d in request["dtypes"])
        assert all(type(i) is int for i in request["ints"])
    # the longest kernels are handed out first: the slowest compile does not start after the others are done
    sizes = [build_workers.source_size(getattr(module, request["launcher"])) for request in requests]
    assert sizes == sorted(sizes, reverse=True), sizes


def test_a_kernel_whose_precompile_raises_is_left_to_the_graphs_process():
    """Its error must surface where the graph compiles, as one kernel falling back to ATen: while the requests
    for the workers are made it would have failed the whole graph."""
    class BrokenKernel:
        def precompile(self, module):
            raise RuntimeError("this kernel does not compile")

    assert build_workers.requests_for(object(), {"triton_broken": BrokenKernel()}) == []


def test_one_core_or_a_failed_start_compiles_in_the_graphs_process(monkeypatch):
    monkeypatch.setattr(build_workers, "_pool", None)
    monkeypatch.setenv("KILN_BUILD_JOBS", "1")
    assert build_workers.start("cuda:0") is None
    monkeypatch.setattr(build_workers, "_pool", None)
    monkeypatch.setenv("KILN_BUILD_JOBS", "4")
    monkeypatch.setattr(build_workers, "_gpu_target", lambda device: 1 / 0)  # no GPU driver
    assert build_workers.start("cuda:0") is None
    monkeypatch.setattr(build_workers, "_pool", None)
    monkeypatch.setattr(build_workers, "_always_compiles", lambda: True)  # TRITON_ALWAYS_COMPILE: no cache to share
    monkeypatch.setattr(build_workers, "BuildWorkers", lambda *a: pytest.fail("workers started"))
    assert build_workers.start("cuda:0") is None
    monkeypatch.setattr(build_workers, "_pool", None)


def test_ranks_of_one_host_share_its_cores(monkeypatch):
    monkeypatch.setenv("KILN_BUILD_JOBS", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert build_workers.worker_count() == 2
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert build_workers.worker_count() == 16


def test_a_host_of_many_cores_starts_a_bounded_number_of_workers(monkeypatch):
    monkeypatch.delenv("KILN_BUILD_JOBS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(build_workers.cache, "build_jobs", lambda: 128)
    assert build_workers.worker_count() == build_workers.DEFAULT_MAX_WORKERS
    monkeypatch.setenv("KILN_BUILD_JOBS", "128")  # asked for: as many as asked
    monkeypatch.setattr(build_workers.cache, "build_jobs", lambda: 128)
    assert build_workers.worker_count() == 128


def _process_state(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of a live process, None once it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in "ZX" else (fields[0], int(fields[1]))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_workers_are_forked_from_one_process_and_stop_with_the_pool(tmp_path):
    """torch, Triton and kiln are imported once, by the first worker, which forks the others (each started on its
    own spent seconds of CPU on those imports); closing the pool stops every worker."""
    workers = build_workers.BuildWorkers(3, ["cuda", 90, 32], str(tmp_path))
    try:
        deadline = time.monotonic() + 240
        while workers.ready() < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert workers.live == 3
        leader, *forked = workers.pids
        assert leader == workers.leader.pid and len(set(forked)) == 2
        assert all(_process_state(pid)[1] == leader for pid in forked)
    finally:
        workers.close()
    deadline = time.monotonic() + 30
    while any(_process_state(pid) for pid in workers.pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_process_state(pid) for pid in workers.pids)


SHELLED_IMPORTS = textwrap.dedent('''
    import importlib.util, json, sys
    spec = importlib.util.spec_from_file_location("worker", sys.argv[1])
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    worker._kiln_packages_as_shells()
    import kiln.codegen.triton.helpers, kiln.codegen.triton.launch
    print(json.dumps({"kiln": sorted(m for m in sys.modules if m.split(".")[0] == "kiln"),
                      "launch": kiln.codegen.triton.launch.__file__}))
''')


def test_a_worker_imports_of_kiln_only_what_kernel_modules_import():
    """A worker starts by importing what a kernel module imports: not kiln's compiler, which its package
    `__init__` imports (as much CPU again as torch's import, while the kernels waited for a worker)."""
    from kiln.codegen.triton import build_worker_process, launch

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    done = subprocess.run([sys.executable, "-c", SHELLED_IMPORTS, build_worker_process.__file__],
                          capture_output=True, text=True, env=env, cwd="/", timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["launch"] == launch.__file__  # kiln's own modules, found through the shells
    assert "kiln.codegen.triton.helpers" in result["kiln"]
    compiler = [m for m in result["kiln"] if m.startswith(("kiln.pipeline", "kiln.api", "kiln.capture", "kiln.lower",
                                                           "kiln.schedule", "kiln.autograd"))]
    assert compiler == [], compiler


def test_the_graphs_process_compiles_what_no_worker_is_ready_for(tmp_path):
    """A build that starts while the workers still import torch and Triton does not wait for them: the graph's
    process compiles every request itself (its errors reported as a worker's would be)."""
    def compile_here(request):
        compiled.append(request["launcher"])
        if request["launcher"] == "broken":
            raise ValueError("does not compile")

    compiled = []
    workers = build_workers.BuildWorkers(2, ["cuda", 90, 32], str(tmp_path))
    try:
        requests = [{"launcher": name} for name in ("first", "broken", "third")]
        assert workers.build(requests, compile_here) == {0: None, 1: "ValueError: does not compile", 2: None}
        assert compiled == ["first", "broken", "third"]
    finally:
        workers.close()
