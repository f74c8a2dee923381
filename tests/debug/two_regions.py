"""A user script for the CLI tests: two torch.compile calls, a graph break, a recompile."""
import sys

import torch


def scale(x):
    y = torch.sin(x) * 2
    print("graph break here")  # the break the report must name with this file:line
    return y.softmax(-1)


def shift(x):
    return torch.relu(x - 1).sum(-1)


if __name__ == "__main__":
    compiled_scale = torch.compile(scale)
    compiled_shift = torch.compile(shift, backend="eager")
    for _ in range(3):
        compiled_scale(torch.randn(4, 8))
    compiled_shift(torch.randn(4, 8))
    compiled_shift(torch.randn(5, 3))  # another shape: a recompile of shift
    print("script args:", sys.argv[1:])
