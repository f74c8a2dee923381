"""Bundled example programs (`python -m kiln run` runs vit_train)."""
