"""Tensors in the graph: torch functions, torch.nn.functional, tensor methods, in-place ops,
indexing and slicing, item assignment, and metadata (.shape, .size(), .dim(), .dtype, .device)
answered as constants.
"""
import pytest
import torch
import torch.nn.functional as F

from support.capture import check, t

# (name, function, input shapes, requires grad)
TORCH_FUNCTIONS = [
    ("sin", lambda x: torch.sin(x), [(3, 4)], True),
    ("exp_log", lambda x: torch.log(torch.exp(x) + 1), [(3, 4)], True),
    ("sigmoid_tanh", lambda x: torch.sigmoid(x) * torch.tanh(x), [(3, 4)], True),
    ("matmul", lambda a, b: torch.matmul(a, b), [(3, 4), (4, 5)], True),
    ("bmm", lambda a, b: torch.bmm(a, b), [(2, 3, 4), (2, 4, 5)], True),
    ("einsum", lambda a, b: torch.einsum("ij,jk->ik", a, b), [(3, 4), (4, 2)], True),
    ("cat", lambda a, b: torch.cat([a, b], dim=1), [(3, 4), (3, 2)], True),
    ("stack", lambda a, b: torch.stack((a, b)), [(3, 4), (3, 4)], True),
    ("where", lambda a, b: torch.where(a > 0, a, b), [(3, 4), (3, 4)], True),
    ("clamp", lambda x: torch.clamp(x, min=-0.5, max=0.5), [(3, 4)], True),
    ("sum_dim", lambda x: torch.sum(x, dim=1, keepdim=True), [(3, 4)], True),
    ("mean", lambda x: torch.mean(x), [(3, 4)], True),
    ("max_dim", lambda x: torch.max(x, dim=1), [(3, 4)], False),
    ("max_dim_values", lambda x: torch.max(x, dim=1).values * 2, [(3, 4)], True),
    ("topk", lambda x: torch.topk(x, 2).indices, [(3, 4)], False),
    ("sort", lambda x: torch.sort(x, dim=-1)[0], [(3, 4)], True),
    ("argmax", lambda x: torch.argmax(x, dim=0), [(3, 4)], False),
    ("cumsum", lambda x: torch.cumsum(x, 0), [(3, 4)], True),
    ("split", lambda x: torch.split(x, 2, dim=1), [(3, 4)], True),
    ("chunk", lambda x: torch.chunk(x, 3, dim=0), [(3, 4)], True),
    ("zeros_ones_full", lambda x: x + torch.zeros(3, 4) + torch.ones_like(x) + torch.full((3, 4), 2.0), [(3, 4)], True),
    ("arange", lambda x: x * torch.arange(4), [(3, 4)], True),
    ("linspace", lambda x: x + torch.linspace(0, 1, 4), [(3, 4)], True),
    ("eye", lambda x: x @ torch.eye(4), [(3, 4)], True),
    ("tensor_ctor", lambda x: x * torch.tensor([1.0, 2.0, 3.0, 4.0]), [(3, 4)], True),
    ("flatten", lambda x: torch.flatten(x, 1), [(2, 3, 4)], True),
    ("transpose", lambda x: torch.transpose(x, 0, 1).contiguous(), [(3, 4)], True),
    ("permute", lambda x: x.permute(2, 0, 1), [(2, 3, 4)], True),
    ("reshape_view", lambda x: x.reshape(6, 4).view(4, 6), [(2, 3, 4)], True),
    ("squeeze_unsqueeze", lambda x: x.unsqueeze(0).squeeze(0).unsqueeze(-1), [(3, 4)], True),
    ("expand_repeat", lambda x: x.expand(2, 3, 4) + x.repeat(2, 1, 1), [(3, 4)], True),
    ("gather", lambda x: torch.gather(x, 1, torch.tensor([[0], [1], [2]])), [(3, 4)], True),
    ("masked_fill", lambda x: x.masked_fill(x > 0, 0.0), [(3, 4)], True),
    ("tril", lambda x: torch.tril(x), [(4, 4)], True),
    ("norm", lambda x: torch.linalg.norm(x, dim=-1), [(3, 4)], True),
    ("outer", lambda a, b: torch.outer(a, b), [(3,), (4,)], True),
    ("addmm", lambda a, b, c: torch.addmm(a, b, c), [(3, 5), (3, 4), (4, 5)], True),
    ("baddbmm", lambda a, b, c: torch.baddbmm(a, b, c), [(2, 3, 5), (2, 3, 4), (2, 4, 5)], True),
    ("dtype_cast", lambda x: x.to(torch.float64).sum().float(), [(3, 4)], True),
    ("type_as", lambda a, b: a.type_as(b), [(3, 4), (3, 4)], True),
    ("rand_like_shape", lambda x: torch.rand_like(x).shape[0] * x, [(3, 4)], True),
    ("detach", lambda x: x.detach() * 2 + x, [(3, 4)], True),
    ("new_zeros", lambda x: x.new_zeros(2, 2).sum() + x, [(3, 4)], True),
    ("softmax_method", lambda x: x.softmax(-1).log_softmax(0), [(3, 4)], True),
    ("var_std", lambda x: x.var(dim=0) + x.std(), [(3, 4)], True),
    ("abs_neg_sign", lambda x: x.abs().neg().sign(), [(3, 4)], False),
    ("all_any", lambda x: (x > 0).all(dim=0) | (x < 0).any(dim=0), [(3, 4)], False),
    ("complex_chain", lambda x: (x.relu().pow(2).sqrt() + 1e-3).rsqrt().mean(-1), [(3, 4)], True),
]


@pytest.mark.parametrize("name,fn,shapes,grad", TORCH_FUNCTIONS, ids=[c[0] for c in TORCH_FUNCTIONS])
def test_torch_function(name, fn, shapes, grad):
    torch.manual_seed(0)
    args = [t(*s, grad=grad) for s in shapes]
    check(fn, *args, graphs=1, records=1, fullgraph=True)


FUNCTIONAL = [
    ("relu", lambda x: F.relu(x)),
    ("gelu", lambda x: F.gelu(x, approximate="tanh")),
    ("silu", lambda x: F.silu(x)),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.1)),
    ("softmax", lambda x: F.softmax(x, dim=-1)),
    ("log_softmax", lambda x: F.log_softmax(x, dim=1)),
    ("layer_norm", lambda x: F.layer_norm(x, (4,))),
    ("normalize", lambda x: F.normalize(x, dim=-1)),
    ("linear", lambda x: F.linear(x, torch.ones(2, 4), torch.zeros(2))),
    ("dropout_eval", lambda x: F.dropout(x, p=0.5, training=False)),
    ("pad", lambda x: F.pad(x, (1, 1))),
    ("mse", lambda x: F.mse_loss(x, torch.zeros_like(x))),
    ("cross_entropy", lambda x: F.cross_entropy(x, torch.tensor([0, 1, 3]))),
    ("one_hot", lambda x: F.one_hot(torch.tensor([0, 2, 1]), 4) * x),
    ("embedding", lambda x: F.embedding(torch.tensor([[0, 2]]), x)),
    ("conv1d", lambda x: F.conv1d(x.unsqueeze(0), torch.ones(2, 3, 2))),
    ("max_pool", lambda x: F.max_pool1d(x.unsqueeze(0), 2)),
    ("avg_pool2d", lambda x: F.avg_pool2d(x.view(1, 1, 3, 4), 2, ceil_mode=True)),
    ("interpolate", lambda x: F.interpolate(x.unsqueeze(0), scale_factor=2, mode="nearest")),
    ("sdpa", lambda x: F.scaled_dot_product_attention(x.view(1, 1, 3, 4), x.view(1, 1, 3, 4), x.view(1, 1, 3, 4))),
]


@pytest.mark.parametrize("name,fn", FUNCTIONAL, ids=[c[0] for c in FUNCTIONAL])
def test_functional(name, fn):
    check(fn, t(3, 4, grad=True), graphs=1, records=1, fullgraph=True)


INDEXING = [
    ("int", lambda x: x[1]),
    ("neg_int", lambda x: x[-1]),
    ("slice", lambda x: x[1:3]),
    ("step_slice", lambda x: x[::2]),
    ("two_dims", lambda x: x[1:, :2]),
    ("ellipsis", lambda x: x[..., 1]),
    ("none", lambda x: x[None, :, None]),
    ("index_tensor", lambda x: x[torch.tensor([0, 2])]),
    ("mixed", lambda x: x[0, 1:3]),
    ("shape_slice", lambda x: x[: x.shape[0] // 2]),
    ("list_index", lambda x: x[[0, 1]]),
]


@pytest.mark.parametrize("name,fn", INDEXING, ids=[c[0] for c in INDEXING])
def test_indexing(name, fn):
    check(fn, t(4, 4, grad=True), graphs=1, records=1, fullgraph=True)


def setitem_scalar(x):
    y = x.clone()
    y[0] = 0.0
    return y


def setitem_slice_tensor(x):
    y = x.clone()
    y[:, 1:3] = x[:, :2] * 2
    return y


def setitem_mask(x):
    y = x.clone()
    y[y < 0] = 0.0
    return y


def setitem_input_inplace(x):
    x[0] = 1.0
    return x.sum()


def inplace_methods(x):
    y = x.clone()
    y.add_(1).mul_(2)
    y.clamp_(max=3.0)
    y.zero_()[0].fill_(5.0)
    return y


def inplace_on_input(x):
    x.mul_(2)
    x.add_(1)
    return None


def inplace_on_input_returns_it(x):
    return x.sub_(3)


def inplace_view(x):
    y = x.clone()
    v = y[1]
    v.mul_(10)
    return y


def copy_into(x, y):
    x.copy_(y * 2)
    return x + 0


def inplace_relu_module_fn(x):
    return F.relu(x.clone(), inplace=True)


SETITEM = [setitem_scalar, setitem_slice_tensor, setitem_mask, inplace_methods, inplace_view, inplace_relu_module_fn]


@pytest.mark.parametrize("fn", SETITEM, ids=[f.__name__ for f in SETITEM])
def test_setitem_and_inplace(fn):
    check(fn, t(3, 4, grad=True), graphs=1, records=1, fullgraph=True)


@pytest.mark.parametrize("fn", [setitem_input_inplace, inplace_on_input, inplace_on_input_returns_it],
                         ids=lambda f: f.__name__)
def test_inplace_on_inputs_is_visible(fn):
    check(fn, t(3, 4), graphs=1, records=1, fullgraph=True)


def test_copy_into_input():
    check(copy_into, t(3), t(3), graphs=1, fullgraph=True)


def metadata(x):
    n, m = x.shape
    a = x.size()
    b = x.size(1)
    c = x.dim() + x.ndim + x.numel()
    info = (x.dtype, x.device, x.requires_grad, x.is_floating_point(), x.shape[-1], len(x), x.stride(),
            x.is_contiguous())
    return x.view(m, n) * (b + c), a, info


def metadata_in_control_flow(x):
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    if x.device.type == "cuda":
        x = x * 100
    if x.requires_grad:
        x = x * 2
    return x.new_ones(x.shape) + x


def metadata_builds_shapes(x):
    b, *rest = x.shape
    return x.reshape(b, -1), torch.zeros(*rest), x.new_empty((b,)).shape


@pytest.mark.parametrize("fn", [metadata, metadata_in_control_flow, metadata_builds_shapes], ids=lambda f: f.__name__)
@pytest.mark.parametrize("grad", [False, True])
def test_metadata_constants(fn, grad):
    check(fn, t(3, 4, grad=grad), graphs=1, records=1, fullgraph=True)


def test_int_and_bool_tensors():
    def fn(idx, mask, x):
        return x[idx] * mask[idx].float()[:, None], idx.sum(), mask.any(), idx.dtype

    check(fn, torch.tensor([0, 2, 1]), torch.tensor([True, False, True]), t(3, 2, grad=True), graphs=1,
          fullgraph=True)


def test_scalar_tensor_and_zero_dim():
    def fn(x, s):
        return x * s, s + 1, s.dim()

    check(fn, t(3), torch.tensor(2.0), graphs=1, fullgraph=True)


def test_tensor_attributes_T_and_data():
    def fn(x):
        return x.T @ x, x.mT.shape, x.data * 2

    check(fn, t(3, 4, grad=True), graphs=1, fullgraph=True)


def test_parameter_input():
    p = torch.nn.Parameter(torch.randn(3))

    def fn(x, p):
        return x * p

    check(fn, t(3), p, graphs=1, fullgraph=True)


def test_tensor_iteration_unpack():
    def fn(x):
        a, b, c = x
        return a + b * c

    check(fn, t(3, 2, grad=True), graphs=1, fullgraph=True)


def test_boolean_mask_has_a_data_dependent_shape():
    """x[mask] has a shape that depends on the mask's values; whatever capture does, eager's result."""
    def fn(x):
        y = x * 2
        z = y[y > 0]
        return z.sum() + z.shape[0]

    import kiln

    compiled = kiln.compile(fn, backend="eager")
    for _ in range(4):
        x = t(4, 4)
        torch.testing.assert_close(compiled(x), fn(x))
