"""The package's import graph: stages depend one way, modules import at their tops, no cycles.

A module's header should say what it depends on. These tests read every module of kiln/ (its source, not
its runtime state) and check three things a reviewer would otherwise check by hand:

- the stages import one way (`LAYERS`): capture knows nothing of code generation, the runtime imports no
  stage, nothing but the public entry points imports debug;
- an import inside a function is the exception, listed in `FUNCTION_LEVEL` with the reason it cannot be
  at the top (an optional dependency, or a cycle between trackers that model mutually recursive Python
  types), and every listed one still exists;
- without those listed imports the module graph has no cycle.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "kiln"

# Each unit (a stage package or a top-level module) and its layer: a unit imports only units of lower layers.
LAYERS = {
    "kiln.config": 0,
    "kiln.torch_switches": 0,  # torch's TORCH_LOGS, read before torch is imported (by `import kiln`, first)
    "kiln.effects": 0,  # which FX nodes dead-code elimination keeps: torch's purity differs between versions
    "kiln.size_python": 0,  # symbolic sizes printed as Python, and the names that Python reads
    "kiln.runtime": 1,  # the on-disk cache, compile lock, CUDA graphs, autotuner: services the stages use
    "kiln.capture": 2,
    "kiln.autograd": 2,
    "kiln.lower": 2,
    "kiln.schedule": 3,
    "kiln.fallbacks": 1,  # fallback accounting every stage reports to
    "kiln.progress": 1,  # the compile progress bar the pipeline drives
    "kiln.compiled_autograd": 1,  # the engine hook's tracer; capture asks it whether .backward() is a boundary
    "kiln.codegen": 4,
    "kiln.pipeline": 5,  # the default backend: autograd, then lower, schedule and the printers, stage by stage
    "kiln.backends": 6,
    "kiln.distributed": 6,  # DDP's bucket split around any backend; what kiln.compile does with a DDP wrapper
    "kiln.optim": 6,  # compiled optimizer steps: traced updates handed to the region's backend
    "kiln.api": 7,
    "kiln.debug": 8,
    "kiln.examples": 8,
    "kiln": 9,  # kiln/__init__.py: the public API
    "kiln.__main__": 10,
}

_CYCLE = "cycle between trackers of mutually recursive Python types: "

# (importer, imported) -> why the import is inside a function.
FUNCTION_LEVEL = {
    **{("kiln.codegen.triton.build_worker_process", module):
       "a build worker runs this file as a script: kiln's packages must be registered as shells (no __init__) "
       "before a kernel module's imports, and torch and Triton are imported once, in the first worker, before it forks"
       for module in ("torch", "triton", "triton.backends.compiler", "triton.compiler.compiler",
                      "triton.runtime.cache", "triton.backends.nvidia.driver", "kiln.codegen.triton.helpers",
                      "kiln.codegen.triton.launch")},
    ("kiln.runtime.autotune", "triton.testing"): "optional dependency: only GPU autotuning benchmarks with Triton",
    ("kiln.runtime.triton_cache", "triton"):
        "optional dependency: only a process that loaded Triton binaries, or a blob carrying some, needs Triton",
    ("kiln.runtime.triton_binaries", "triton"):
        "optional dependency: only a GPU graph's kernels are stored or loaded, and kiln runs without Triton on the CPU",
    ("kiln.runtime.autotune", "tqdm"): "optional dependency: a progress bar where tqdm is installed",
    ("kiln.progress", "tqdm"): "optional dependency: a progress bar where tqdm is installed",
    ("kiln.capture.values.constant", "kiln.capture.values.exceptions"):
        _CYCLE + "a constant's missing attribute raises AttributeError; exceptions carry constants",
    ("kiln.capture.values.constant", "kiln.capture.values.functions"):
        _CYCLE + "a constant's method is a BuiltinValue; functions answer `__name__` with constants",
    ("kiln.capture.values.exceptions", "kiln.capture.values.containers"):
        _CYCLE + "an exception's `.args` is a tuple; containers raise IndexError and ValueError",
    ("kiln.capture.values.containers", "kiln.capture.values.tensor"):
        _CYCLE + "indexing or hashing by a tensor; a tensor's size is a SizeValue, a tuple",
    ("kiln.capture.values.containers", "kiln.capture.values.dicts"):
        _CYCLE + "a namedtuple's _asdict and a constant dict make dicts; dicts hold container items",
    ("kiln.capture.values.containers", "kiln.capture.values.operators"):
        _CYCLE + "a size's numel multiplies its items; operators build containers",
    ("kiln.capture.values.containers", "kiln.capture.values.objects"):
        _CYCLE + "a dict key that is no literal is an object tracker; objects are built from containers",
    ("kiln.capture.values.tensor", "kiln.capture.values.dicts"):
        _CYCLE + "a dict of tensors passed to an op lowers item by item; dicts hold tensors",
    ("kiln.capture.values.functions", "kiln.capture.values.dicts"):
        _CYCLE + "a made function's `__annotations__` is a dict; dicts' methods are functions",
    ("kiln.capture.values.operators", "kiln.capture.values.dicts"):
        _CYCLE + "`==`, `|` and `in` on dicts; dicts compare their keys and values with operators",
    ("kiln.capture.values.torch_api", "kiln.capture.values.objects"):
        _CYCLE + "torch.nn.Module() and torch's submodules are object trackers; objects wrap torch attributes",
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    in_function: bool


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str, path: Path) -> list[Import]:
    """Every import of `path`, resolved to the module it loads (`from a import b` is `a.b` when that is a
    module); imports under `if TYPE_CHECKING:` are for annotations only and are skipped."""
    found = []

    def visit(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(Import(name, a.name, child.lineno, nested) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module != "__future__":
                for a in child.names:
                    full = f"{child.module}.{a.name}"
                    found.append(Import(name, full if full in MODULES else child.module, child.lineno, nested))
            visit(child, nested)

    visit(ast.parse(path.read_text()), False)
    return found


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    """Every import of every kiln module: parsed where the tests run, once, not while the suite is collected (each
    xdist worker collects it)."""
    return [imp for name, path in MODULES.items() for imp in _imports(name, path)]


def _unit(module: str) -> str:
    """The stage package or top-level module `module` belongs to (`kiln.capture.values.tensor` -> `kiln.capture`)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def test_every_unit_has_a_layer():
    missing = sorted({_unit(m) for m in MODULES} - set(LAYERS))
    assert not missing, f"give each new stage or top-level module a layer in LAYERS: {missing}"


def test_stages_import_one_way(imports):
    wrong = [f"{i.importer}:{i.line} imports {i.imported} ({_unit(i.importer)} is layer {LAYERS[_unit(i.importer)]}, "
             f"{_unit(i.imported)} layer {LAYERS[_unit(i.imported)]})"
             for i in imports if i.imported.startswith("kiln") and _unit(i.importer) != _unit(i.imported)
             and _unit(i.imported) in LAYERS and LAYERS[_unit(i.importer)] <= LAYERS[_unit(i.imported)]]
    assert not wrong, "a stage imports a stage at its own layer or above:\n" + "\n".join(wrong)


def test_imports_inside_functions_are_the_listed_exceptions(imports):
    found = {(i.importer, i.imported): i for i in imports if i.in_function}
    unlisted = [f"{i.importer}:{i.line} imports {i.imported} inside a function"
                for key, i in sorted(found.items()) if key not in FUNCTION_LEVEL]
    assert not unlisted, ("import at the module top, or route the call through a seam (the capture state); "
                          "list it in FUNCTION_LEVEL only with the reason it cannot be at the top:\n"
                          + "\n".join(unlisted))
    stale = sorted(set(FUNCTION_LEVEL) - set(found))
    assert not stale, f"FUNCTION_LEVEL lists imports that no longer exist: {stale}"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` (as the modules along it), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)):
            return found
    return None


def test_no_import_cycles_besides_the_listed_ones(imports):
    graph: dict[str, set[str]] = {}
    for i in imports:
        if i.imported in MODULES and i.imported != i.importer and (i.importer, i.imported) not in FUNCTION_LEVEL:
            graph.setdefault(i.importer, set()).add(i.imported)
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("graph, has_cycle", [({"a": {"b"}, "b": {"c"}}, False), ({"a": {"b"}, "b": {"a"}}, True),
                                              ({"a": {"b", "c"}, "c": {"d"}, "d": {"a"}}, True)])
def test_the_cycle_check_finds_cycles(graph, has_cycle):
    assert (_cycle(graph) is not None) == has_cycle
