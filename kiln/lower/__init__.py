"""Lowering: ATen FX graph -> loop-level IR (see ir.py)."""
from kiln.lower.graph import lower_graph
from kiln.lower.values import Unsupported

__all__ = ["lower_graph", "Unsupported"]
