"""Opcode handlers, one module per family; each registers itself in `registry.OPCODES`.

Importing the package imports every family, so the table is full once `OPCODES` is importable.
"""
from kiln.capture.opcodes import calls, containers, control, exceptions, names, operators, stack  # noqa: F401
from kiln.capture.opcodes.registry import OPCODES, Return

__all__ = ["OPCODES", "Return"]
