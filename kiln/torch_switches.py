"""torch's debugging switches, read before torch is imported.

torch parses `TORCH_LOGS` when it is imported and raises on a name it does not know. A script written
for torch.compile and run under kiln (`python -m kiln run`) may name topics kiln has no log for; those
are one warning (kiln/debug/logs.py), not an error. So `claim_torch_logs()` runs first thing in
`import kiln`: it keeps the user's spec for kiln's loggers and leaves torch only the names kiln maps
(all of them torch's own names too). Where torch was imported before kiln, torch has read the spec already
and this changes nothing.
"""
from __future__ import annotations

import os
import sys

# TORCH_LOGS names (torch/_logging/_registrations.py) -> kiln's topics. The components (dynamo, aot,
# inductor) take their stage's topics; artifacts map one to one where kiln has the same thing.
TORCH_TOPICS: dict[str, tuple[str, ...]] = {
    "dynamo": ("capture", "graph_breaks", "recompiles"),
    "aot": ("aot",),
    "inductor": ("pipeline", "lower", "fallbacks"),
    "graph_breaks": ("graph_breaks",),
    "recompiles": ("recompiles",),
    "recompiles_verbose": ("recompiles",),
    "guards": ("guards",),
    "verbose_guards": ("guards",),
    "graph": ("graph",),
    "graph_code": ("graph",),
    "graph_code_verbose": ("graph",),
    "bytecode": ("bytecode",),
    "aot_graphs": ("aot",),
    "aot_joint_graph": ("aot",),
    "output_code": ("output_code",),
    "kernel_code": ("output_code",),
    "perf_hints": ("perf_hints",),
    "all": ("all",),
}

_torch_logs: str | None = None


def torch_logs() -> str | None:
    """The TORCH_LOGS the process started with (before `claim_torch_logs` narrowed it)."""
    return _torch_logs if _torch_logs is not None else os.environ.get("TORCH_LOGS")


def claim_torch_logs() -> None:
    """Keep TORCH_LOGS for kiln and, if torch is not imported yet, show torch only the names kiln maps."""
    global _torch_logs
    spec = os.environ.get("TORCH_LOGS")
    if spec is None or _torch_logs is not None:
        return
    _torch_logs = spec
    if "torch" in sys.modules:
        return
    known = [raw.strip() for raw in spec.split(",") if raw.strip().lstrip("+-") in TORCH_TOPICS]
    os.environ["TORCH_LOGS"] = ",".join(known)
