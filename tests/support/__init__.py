"""Helpers shared by the test packages (imported as `support.<module>`: pytest puts tests/ on sys.path)."""
