"""MobileNetV2 (inverted residuals: batch norm, ReLU6, depthwise and strided convolutions) through kiln's
default backend, side by side with eager: outputs, every parameter's gradient and the batch-norm running
statistics, in training and eval mode, with contiguous and channels-last images.

The transformers zoo reported mobilenet_v2's training gradients as different from eager. They differ from the
float64 gradients by no more than torch.compile's do: with a batch of 2 and 32x32 images the last batch norms
normalise over two values each, which amplifies float32 rounding in the backward to ~1e-3 of the largest
gradient. Here the batch is large enough for batch norm to be well-conditioned, so kiln must agree with eager
closely, and the ReLU6 boundaries (0 and 6, where eager's gradient is 0) are checked exactly.

CI runs two of the four mode x layout cases (`KILN_MATRIX_SWEEP=1`: all four).
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import kiln
from support.small_models import CLASSES, MobileNetV2

BATCH, IMAGE = 8, 32


def step(run, model, images, labels, train: bool):
    """One forward (by `run`: the model or its compiled form) and backward: (output, gradients by name,
    buffers by name) after it."""
    model.zero_grad(set_to_none=True)
    out = run(images)
    loss = F.cross_entropy(out, labels) if train else out.square().mean()  # eval: backward through eval's BN too
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    return out.detach(), grads, {n: b.clone() for n, b in model.named_buffers()}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest difference relative to the largest value (gradients of different layers differ in scale).

    A projection's batch-norm bias feeding the next block's training-mode batch norm (no residual) has a
    gradient of exactly 0 in exact arithmetic (that norm subtracts the per-channel constant it adds): eager
    and kiln leave rounding residue of ~1e-8 there, so values are measured against a floor of 1e-3.
    """
    return ((actual.double() - expected.double()).abs().max() / expected.double().abs().max().clamp_min(1e-3)).item()


# CI runs the diagonal (training channels-last, eval contiguous): each mode and each layout once
@pytest.mark.sampled(every=2, classes=("train", "layout"))
@pytest.mark.parametrize("layout", [torch.channels_last, torch.contiguous_format], ids=["channels_last", "nchw"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_mobilenet_v2_step_matches_eager(train, layout):
    torch.manual_seed(0)
    model = MobileNetV2().train(train).to(memory_format=layout)
    twin, exact = copy.deepcopy(model), copy.deepcopy(model).double()
    images = torch.randn(BATCH, 3, IMAGE, IMAGE).to(memory_format=layout)
    labels = torch.randint(0, CLASSES, (BATCH,))
    expected = step(model, model, images, labels, train)
    actual = step(kiln.compile(twin), twin, images, labels, train)
    reference = step(exact, exact, images.double(), labels, train)
    torch.testing.assert_close(actual[0], expected[0], atol=1e-4, rtol=1e-4)
    assert actual[1].keys() == expected[1].keys()
    # Each gradient against float64's: kiln within 1e-4 of its scale, or no further than eager's own rounding
    # allows (on a GPU eager's convolutions round inputs to TF32, and batch norm amplifies that).
    errors = {name: (relative_error(actual[1][name], g), relative_error(expected[1][name], g))
              for name, g in reference[1].items()}
    worse = {name: e for name, e in errors.items() if e[0] > max(1e-4, 10 * e[1])}
    assert not worse, sorted(worse.items(), key=lambda kv: -kv[1][0])[:3]
    for name, buffer in expected[2].items():  # running mean and variance, batches counted
        torch.testing.assert_close(actual[2][name], buffer, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("fn", [F.relu6, lambda x: F.hardtanh(x, -2.0, 3.0), lambda x: F.hardtanh(x).mul(2)],
                         ids=["relu6", "hardtanh(-2,3)", "hardtanh"])
def test_hardtanh_gradient_at_its_boundaries_is_eagers(fn):
    """Eager's gradient is 0 at the clamp bounds themselves (an open interval), 1 strictly inside."""
    values = torch.tensor([-3.0, -2.0, -1.0, 0.0, 0.5, 1.0, 3.0, 6.0, 7.0])
    grads = []
    for run in (fn, kiln.compile(fn)):
        x = values.clone().requires_grad_()
        run(x).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0], atol=0, rtol=0)
