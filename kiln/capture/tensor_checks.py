"""Tensor guards checked in C++: one call checks every tensor a cache entry specialized on.

A tensor guard in Python reads six properties through torch's Python bindings, each
read building a Python object (`t.shape` a torch.Size, `t.device` a torch.device):
per tensor. A model's guard checks hundreds of tensors (parameters and buffers included:
`p.data = ...` changes a parameter's shape or device in place), so tensor checks were half of
a guard's time, more than a CUDA-graph replay of the whole model
(benchmarks/guard_overhead.py measures it). Here the same comparisons read the C++ tensor
directly.

The extension is built once per machine and torch version, with the system C++ compiler
against the headers of the installed torch, and kept in kiln's cache directory, checked against
its manifest before it is loaded (kiln/runtime/private_files.py) and built again if broken. The build
takes about half a minute, so it runs in the background: until it is loaded, guards
check tensors in Python (`available()` is False), and each entry registered with
`when_ready` gets its guard function rebuilt once it is. The compiler runs in a detached builder
process (kiln/runtime/detached_build.py) that a thread of this process waits for: a process that exits
sooner leaves the builder to finish and publish the library, which the next process loads at once (a build
in a thread of a short process was killed at its exit, and every process started it again). Any failure
(no compiler, no headers) leaves the Python checks in place, with one log line.

What a spec checks, as the Python guard does: the exact Python type, dtype, device, no negation bit, sizes,
then either `is_contiguous()` or the exact strides, then `requires_grad`.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import sys
import sysconfig
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import torch

from kiln.config import compiler, config
from kiln.runtime import detached_build
from kiln.runtime.cache import folder as cache_folder
from kiln.runtime.cache import rebuild_log, record_use
from kiln.runtime.compiler import BuildError
from kiln.runtime.private_files import discard, verify

log = logging.getLogger("kiln.guards")

SOURCE = r"""
#include <Python.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <vector>

namespace {

struct Spec {
  PyObject* type;  // a new reference, released with the specs
  c10::ScalarType dtype;
  c10::Device device;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // empty: the tensor must be contiguous instead
  bool contiguous;
  bool requires_grad;
};

using Specs = std::vector<Spec>;

void release(PyObject* capsule) {
  auto* specs = static_cast<Specs*>(PyCapsule_GetPointer(capsule, "kiln.tensor_specs"));
  for (Spec& s : *specs) Py_DECREF(s.type);
  delete specs;
}

bool read_ints(PyObject* seq, std::vector<int64_t>& out) {
  Py_ssize_t n = PyTuple_Size(seq);
  if (n < 0) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    int64_t v = PyLong_AsLongLong(PyTuple_GET_ITEM(seq, i));
    if (v == -1 && PyErr_Occurred()) return false;
    out.push_back(v);
  }
  return true;
}

// specs([(type, dtype, device, sizes, strides or None, requires_grad), ...]) -> capsule
PyObject* make_specs(PyObject*, PyObject* list) {
  auto* specs = new Specs();
  Py_ssize_t n = PyList_Size(list);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* t = PyList_GET_ITEM(list, i);
    PyObject *type = PyTuple_GetItem(t, 0), *dtype = PyTuple_GetItem(t, 1), *device = PyTuple_GetItem(t, 2);
    PyObject *sizes = PyTuple_GetItem(t, 3), *strides = PyTuple_GetItem(t, 4), *grad = PyTuple_GetItem(t, 5);
    if (!type || !grad || !THPDtype_Check(dtype) || !THPDevice_Check(device)) {
      delete specs;
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "kiln: malformed tensor spec");
      return nullptr;
    }
    Spec s{type, reinterpret_cast<THPDtype*>(dtype)->scalar_type, reinterpret_cast<THPDevice*>(device)->device,
           {}, {}, strides == Py_None, grad == Py_True};
    if (!read_ints(sizes, s.sizes) || (!s.contiguous && !read_ints(strides, s.strides))) {
      delete specs;
      return nullptr;
    }
    Py_INCREF(type);
    specs->push_back(std::move(s));
  }
  return PyCapsule_New(specs, "kiln.tensor_specs", release);
}

bool matches(PyObject* obj, const Spec& s) {
  if (reinterpret_cast<PyObject*>(Py_TYPE(obj)) != s.type || !THPVariable_Check(obj)) return false;
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (t.layout() != c10::kStrided || t.scalar_type() != s.dtype || t.device() != s.device) return false;
  if (t.is_neg()) return false;  // a lazily negated tensor: compiled code never takes one
  if (t.sizes() != c10::IntArrayRef(s.sizes)) return false;
  if (s.contiguous ? !t.is_contiguous() : t.strides() != c10::IntArrayRef(s.strides)) return false;
  return t.requires_grad() == s.requires_grad;
}

// check(specs, *tensors) -> bool: every tensor matches its spec
PyObject* check(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  auto* specs = nargs ? static_cast<Specs*>(PyCapsule_GetPointer(args[0], "kiln.tensor_specs")) : nullptr;
  if (!specs) return nullptr;
  if (static_cast<size_t>(nargs - 1) != specs->size()) {
    PyErr_SetString(PyExc_TypeError, "kiln: tensor check called with the wrong number of tensors");
    return nullptr;
  }
  try {
    for (Py_ssize_t i = 1; i < nargs; ++i)
      if (!matches(args[i], (*specs)[i - 1])) Py_RETURN_FALSE;
  } catch (const std::exception&) {  // a tensor whose sizes cannot be read: not the one compiled for
    Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

PyMethodDef methods[] = {
    {"specs", make_specs, METH_O, "compile a list of tensor specs"},
    {"check", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(check)), METH_FASTCALL,
     "check(specs, *tensors)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "kiln_tensor_checks", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_kiln_tensor_checks() { return PyModule_Create(&module); }
"""

NATIVE_TYPES = (torch.Tensor, torch.nn.Parameter)
"""Types whose properties the C++ check reads as Python would (a subclass may override them in Python)."""

_module = None
_state = "idle"  # idle -> building -> ready | failed
_lock = threading.Lock()
_waiting: list[Callable[[], None]] = []  # rebuilds to run once the extension is loaded
_build_thread: threading.Thread | None = None


def available():
    """The loaded extension, or None (starting its build in the background the first time; a build that
    an earlier process left in the cache directory is loaded at once)."""
    if _module is None and _state == "idle":
        _start()
    return _module


def wait(timeout: float | None = None):
    """The extension, building it now if needed (tests; None if it cannot be built)."""
    available()
    thread = _build_thread
    if thread is not None:
        thread.join(timeout)
    return _module


def when_ready(owner, rebuild: Callable[[object], None]) -> None:
    """Call `rebuild(owner)` once the extension is loaded (not at all if `owner` is gone by then)."""
    ref = weakref.ref(owner)

    def run():
        obj = ref()
        if obj is not None:
            rebuild(obj)

    with _lock:
        if _state == "building":
            _waiting.append(run)
            return
    if _module is not None:
        run()


def _start() -> None:
    global _module, _state, _build_thread
    with _lock:
        if _state != "idle":
            return
        path = None
        try:
            path = _library_path()
            problem = verify(path)
            if problem is None:
                _module, _state = _load(path), "ready"
                return
            if problem != "missing":
                rebuild_log(path, problem)
                discard(path)
        except Exception as e:  # noqa: BLE001 -- a broken cached build: build it again
            if path is not None:
                rebuild_log(path, f"the loader rejected it ({e})")
                discard(path)
        _state = "building"
        try:  # the builder starts here, not in the thread: a process that exits at once still leaves it running
            build = _start_build(path)
        except Exception as e:  # noqa: BLE001 -- no builder (no interpreter to run it): the checks stay in Python
            _state = "failed"
            log.info("kiln: tensor guards stay in Python (the C++ checks could not be built: %s)", e)
            return
        # A daemon: an exiting program does not wait for the build, whose detached builder finishes it alone
        _build_thread = threading.Thread(target=_build_and_load, args=(build,), name="kiln-tensor-checks",
                                         daemon=True)
        _build_thread.start()


def _build_and_load(build: detached_build.Build) -> None:
    global _module, _state
    try:
        module = _build_and_load_once(build)
    except Exception as e:  # noqa: BLE001 -- any failure leaves the Python checks in place
        log.info("kiln: tensor guards stay in Python (the C++ checks could not be built: %s)", str(e)[-300:])
        with _lock:
            _state, waiting = "failed", list(_waiting)
            _waiting.clear()
        return
    with _lock:
        _module, _state, waiting = module, "ready", list(_waiting)
        _waiting.clear()
    for run in waiting:
        run()


def _build_and_load_once(build: detached_build.Build):
    """Wait for `build` and load the extension; a build the loader rejects is built once more, and removed if that
    one fails too (the next process tries again)."""
    path = _wait(build)
    try:
        return _load(path)
    except (ImportError, OSError) as e:
        rebuild_log(path, f"the loader rejected it ({e})")
        discard(path)
    path = _wait(_start_build(path))
    try:
        return _load(path)
    except BaseException:
        discard(path)
        raise


def _flags() -> list[str]:
    root = Path(torch.__file__).parent
    torch_lib = str(root / "lib")
    includes = [f"-I{root / 'include'}", f"-I{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
                f"-I{sysconfig.get_paths()['include']}"]
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    return ["-O2", "-shared", "-fPIC", "-std=c++17", "-w", abi, *includes, f"-L{torch_lib}",
            f"-Wl,-rpath,{torch_lib}", "-ltorch_python", "-ltorch", "-ltorch_cpu", "-lc10"]


def _library_path() -> Path:
    """Where the extension for this source, compiler, torch and Python lives in the cache directory."""
    key = hashlib.sha256("\0".join([SOURCE, compiler(), torch.__version__, sys.version, *_flags()]).encode())
    return cache_folder("ext", key.hexdigest()[:16]) / f"kiln_tensor_checks{importlib.machinery.EXTENSION_SUFFIXES[0]}"


def _start_build(path: Path) -> detached_build.Build:
    """Start compiling the extension to `path` in a detached builder (kiln/runtime/detached_build.py), which
    publishes it with its manifest; a second process building at the same time waits for it and builds nothing."""
    return detached_build.start([compiler(), "{source}", "-o", "{output}", *_flags()], SOURCE, path,
                                config.compiler_timeout)


def _wait(build: detached_build.Build) -> Path:
    try:
        return build.wait()
    except detached_build.DetachedBuildFailed as e:
        raise BuildError(str(e)) from None


def _load(path: Path):
    record_use(path)  # kiln.save_cache_artifacts carries it: a server from the blob loads it, not builds it
    loader = importlib.machinery.ExtensionFileLoader("kiln_tensor_checks", str(path))
    spec = importlib.util.spec_from_file_location("kiln_tensor_checks", str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
