"""Seeing what kiln did: logs, explain(), reports. Debug may import any stage; no stage imports debug."""
