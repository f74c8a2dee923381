"""Compile kiln's generated Triton kernels for an H100 (sm_90) on a machine without a GPU, without running them.

The Triton tests run kernels on CPU tensors through Triton's interpreter, which accepts code that real
compilation rejects: a Python scalar where Triton's compiler needs a block (`tl.store(p, kiln_to_bf16(0.0))`),
a helper reading `.dtype` of a constant. Such a kernel passes every interpreted test and fails on the user's
GPU. Here the same kernels go through Triton's full pipeline for sm_90: TTIR, TTGIR, LLVM IR, PTX and, with the
`ptxas` that Triton's wheel ships, a cubin. Nothing is launched, so no GPU or CUDA driver is needed.

How: while kiln compiles a graph under the interpreter, `recording_builds()` records what kiln would compile
on a GPU (each `Launcher.precompile`: the kernel module, the @triton.jit function, its argument dtypes, integer
arguments, constexprs and num_warps; kiln skips compiling there under the interpreter). `compile_for_sm90(builds)`
then compiles each in a child process started without TRITON_INTERPRET (Triton decides at import whether
`@triton.jit` compiles or interprets, and the test process imported it interpreting). The child answers
requests line by line and lives until the tests end, so Triton and torch are imported once per test process.
Triton's JIT specializes the arguments itself (16-byte alignment, integers equal to 1 or divisible by 16), as
on a GPU, behind a driver that only names the target.

    with recording_builds() as builds:
        compiled = compile_aten_graph(gm, inputs, {"cpu_backend": "triton"})
    assert_compiles_for_sm90(builds)    # or compile_for_sm90(builds): {kernel name: compile error}
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

SM90 = ("cuda", 90, 32)  # GPUTarget(backend, arch, warp size)


@contextlib.contextmanager
def recording_builds():
    """Within the block, the kernels kiln loads are recorded (a list of dicts, see the module docstring)."""
    from kiln.codegen.triton.launch import Launcher

    builds: list[dict] = []
    original = Launcher.precompile

    def record(launcher, dtypes, ints) -> None:
        fn = getattr(launcher.fn, "fn", launcher.fn)  # the Python function behind the (interpreted) JIT function
        builds.append({"path": fn.__code__.co_filename, "name": fn.__name__, "source": inspect.getsource(fn),
                       "dtypes": [str(d).removeprefix("torch.") for d in dtypes], "ints": [int(v) for v in ints],
                       "constexprs": launcher.constexprs, "options": launcher.options})

    Launcher.precompile = record
    try:
        yield builds
    finally:
        Launcher.precompile = original


_child: subprocess.Popen | None = None


def _compiler() -> subprocess.Popen:
    """The child process compiling for sm_90 (started on first use, stopped when the tests end)."""
    global _child
    if _child is None or _child.poll() is not None:
        import kiln

        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.pathsep.join([str(Path(kiln.__file__).parents[1]), env.get("PYTHONPATH", "")])
        _child = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  env=env, text=True)
        atexit.register(_child.kill)
    return _child


_outcomes: dict[str, str | None] = {}  # content key -> the compile error (None: compiled), for this test process


def content_key(build: dict) -> str:
    """What Triton's compile of `build` depends on: the kernel's source under any name, its argument dtypes,
    how Triton specializes its integers (1, a multiple of 16), constexprs and options. Kernels of repeated
    layers, or of the same pattern in two models, share a key and are compiled once per test process."""
    source = build["source"].replace(f"def {build['name']}(", "def kernel(", 1)
    ints = [(v == 1, v % 16 == 0) for v in build["ints"]]
    signature = json.dumps([source, build["dtypes"], ints, build["constexprs"], build["options"]], sort_keys=True)
    return hashlib.sha256(signature.encode()).hexdigest()


def compile_for_sm90(builds: list[dict]) -> dict[str, str]:
    """Compile every recorded kernel for sm_90: {kernel name: the compile error} for those that fail. A kernel
    whose content key was compiled before in this process is not compiled again."""
    keys = [content_key(b) for b in builds]
    todo = {k: b for k, b in zip(keys, builds) if k not in _outcomes}
    if todo:
        child = _compiler()
        child.stdin.write(json.dumps(list(todo.values())) + "\n")
        child.stdin.flush()
        reply = child.stdout.readline()
        if not reply:
            raise RuntimeError(f"the sm_90 compiler process exited ({child.wait()})")
        failed = json.loads(reply)
        _outcomes.update({k: failed.get(b["name"]) for k, b in todo.items()})
    return {b["name"]: _outcomes[k] for k, b in zip(keys, builds) if _outcomes[k] is not None}


def ttgir_for_sm90(build: dict) -> str:
    """The TTGIR (Triton's GPU-level IR, with the memory layouts it chose) of one recorded kernel for sm_90."""
    child = _compiler()
    child.stdin.write(json.dumps({"ttgir": build}) + "\n")
    child.stdin.flush()
    reply = json.loads(child.stdout.readline() or "{}")
    if "error" in reply or "ttgir" not in reply:
        raise RuntimeError(f"the sm_90 compile of {build['name']} failed: {reply.get('error')}")
    return reply["ttgir"]


def assert_compiles_for_sm90(builds: list[dict]) -> None:
    """Fail the calling test with each kernel's compile error if any of `builds` does not compile for sm_90."""
    failures = compile_for_sm90(builds)
    assert not failures, "\n\n".join(f"{name}: {error}" for name, error in failures.items())


# ----------------------------------------------------------------------------- the child process


def _compile_one(build: dict, modules: dict) -> None:
    import importlib.util

    import torch

    path = build["path"]
    if path not in modules:
        spec = importlib.util.spec_from_file_location(f"kiln_sm90_{len(modules)}", path)
        modules[path] = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = modules[path]
        spec.loader.exec_module(modules[path])
    fn = getattr(modules[path], build["name"])
    dtypes = [getattr(torch, d) for d in build["dtypes"]]
    return fn.warmup(*dtypes, *build["ints"], grid=(1,), **build["constexprs"], **build["options"])


def _serve() -> None:
    """Answer each line of builds (JSON) with one line: {kernel name: error} of the builds that fail; a line
    {"ttgir": build} with {"ttgir": its TTGIR} or {"error": why}."""
    import triton
    from triton.backends.compiler import GPUTarget

    from kiln.codegen.triton.build_worker_process import TargetOnlyDriver

    triton.runtime.driver.set_active(TargetOnlyDriver(GPUTarget(*SM90)))
    modules: dict = {}
    for line in sys.stdin:
        request = json.loads(line)
        if isinstance(request, dict):
            try:
                answer = {"ttgir": _compile_one(request["ttgir"], modules).asm["ttgir"]}
            except Exception as e:  # reported to the test
                answer = {"error": f"{type(e).__name__}: {e}"}
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
            continue
        failures = {}
        for build in request:
            try:
                _compile_one(build, modules)
            except Exception as e:  # reported to the test, which names the kernel
                failures[build["name"]] = f"{type(e).__name__}: {e}"
        sys.stdout.write(json.dumps(failures) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()


# A kernel module as kiln writes them (kiln.codegen.triton.HEADER, then kernels and their launchers), for the tests
# that compile one in a child process: one kernel doubling its input.
DOUBLING_KERNEL = '''

@triton.jit
def triton_double(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tl.store(out_ptr0 + xindex, tl.load(in_ptr0 + xindex, xmask) * 2, xmask)


_launch_triton_double = Launcher(triton_double, 2, num_warps=4, XBLOCK=1024)
'''
