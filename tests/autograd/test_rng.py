"""Random ops in compiled training: eager's distribution, and (under aot_eager) eager's exact stream."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from support.autograd import compile_module


class Drop(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p
        self.lin = nn.Linear(64, 64)

    def forward(self, x):
        return F.dropout(self.lin(x), p=self.p, training=True)


def test_dropout_distribution_and_backward_uses_the_forward_mask():
    p = 0.3
    model = Drop(p)
    x = torch.randn(256, 64)
    compiled = compile_module(model, [x])
    out = compiled(x)
    kept = out != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01  # 16384 draws: 4.6 sigma
    reference = model.lin(x).detach()
    torch.testing.assert_close(out[kept], reference[kept] / (1 - p))
    grad = torch.randn_like(out)
    out.backward(grad)
    # d out / d bias = mask / (1 - p): the backward must see the same mask as the forward.
    torch.testing.assert_close(model.lin.bias.grad, (grad * kept / (1 - p)).sum(0))


def test_dropout_stream_matches_eager_exactly_under_aot_eager():
    """Documented behaviour: the ATen graphs draw from the global generator in eager's order."""
    model = Drop(0.5)
    x = torch.randn(32, 64)
    compiled = compile_module(model, [x])
    torch.manual_seed(123)
    eager_out = model(x)
    torch.manual_seed(123)
    compiled_out = compiled(x)
    assert torch.equal(eager_out, compiled_out)
    torch.manual_seed(7)
    with torch.no_grad():
        eager_inference = model(x)
        torch.manual_seed(7)
        assert torch.equal(compiled(x), eager_inference)
