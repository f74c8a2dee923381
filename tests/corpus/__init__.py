"""A corpus of behaviours that PyTorch's own Dynamo and AOTAutograd tests check, written as kiln's own cases.

Each case runs eagerly, through kiln.compile and through torch.compile with a counting backend (the reference
graph count); see reference.py.
"""
