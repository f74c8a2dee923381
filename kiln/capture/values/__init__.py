"""Value trackers: what the interpreter holds on its stack and in its locals."""
