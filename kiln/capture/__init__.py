"""Capture: CPython bytecode -> torch.fx graph + guards + output program (kiln's TorchDynamo)."""
