"""A user's backend that cannot handle relu: the minifier's crashing-backend test (importable, as a repro needs)."""
import torch


def relu_hater(gm: torch.fx.GraphModule, example_inputs: list):
    for node in gm.graph.nodes:
        if node.target in (torch.relu, torch.nn.functional.relu, "relu"):
            raise NotImplementedError("relu is not supported by this backend")
    return gm.forward
