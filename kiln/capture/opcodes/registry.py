"""The table opcode handlers register into: normalized opname -> handler, per Python version.

Apart from the interpreter (which imports every handler module to fill it) so that a handler module
imports the table and `Return` without importing the interpreter back.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiln.capture.bytecode import Instruction
    from kiln.capture.interpreter import Frame
    from kiln.capture.values.base import Value

OPCODES: dict[str, Callable[[Frame, Instruction], None]] = {}


def opcode(*names: str, since: tuple[int, int] = (3, 0), until: tuple[int, int] = (9, 9)):
    """Register a handler for the given (normalized) opnames on the Python versions in [since, until]."""

    def register(handler):
        if since <= sys.version_info[:2] <= until:
            for name in names:
                OPCODES[name] = handler
        return handler

    return register


class Return(Exception):
    """Raised by a return handler: the frame's result, carried out of the handler to `Frame.run`."""

    def __init__(self, value: Value):
        self.value = value
