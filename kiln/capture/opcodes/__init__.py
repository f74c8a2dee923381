"""Opcode handlers, one module per family; each registers itself in `interpreter.OPCODES`."""
