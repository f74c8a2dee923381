"""Snippets of real models, as Dynamo's repro tests collect them: attention masks and scores, position ids,
config objects, padding and packing, loss functions, optimizer-like updates, data-dependent ops, random ops
under a fixed seed, and small numerical edge cases."""
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from .reference import Table, check, t

torch.manual_seed(0)
cases = Table()
Q, K = t(2, 2, 3, 4), t(2, 2, 3, 4)
H = t(2, 3, 4)
A = t(6)
IDS = torch.tensor([[3, 1, 0, 0], [2, 2, 5, 0]])
CONFIG = SimpleNamespace(hidden=4, heads=2, eps=1e-5, use_cache=False, act="gelu")


@cases((Q, K))
def scaled_dot_product_scores(q, k):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    return scores.softmax(-1)


@cases((Q, K))
def sdpa_builtin(q, k):
    return F.scaled_dot_product_attention(q, k, k, is_causal=True)


@cases((Q,))
def causal_mask_with_finfo_min(q):
    n = q.shape[-2]
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
    scores = q @ q.transpose(-1, -2)
    return scores.masked_fill(mask, torch.finfo(scores.dtype).min).softmax(-1)


@cases((IDS,))
def padding_mask_expand(ids):
    mask = (ids != 0)[:, None, None, :].to(torch.float32)
    return (1.0 - mask) * -10000.0, mask.expand(-1, 1, ids.shape[1], -1)


@cases((IDS,))
def position_ids_from_arange(ids):
    pos = torch.arange(ids.shape[1], dtype=torch.long).unsqueeze(0).expand_as(ids)
    return pos, pos * (ids != 0)


@cases((IDS,))
def cumsum_position_ids(ids):
    mask = ids.ne(0).int()
    return (torch.cumsum(mask, dim=1).type_as(mask) * mask).long()


@cases((H,))
def split_heads_and_merge(h):
    b, s, d = h.shape
    heads = h.view(b, s, CONFIG.heads, d // CONFIG.heads).transpose(1, 2)
    return heads.transpose(1, 2).reshape(b, s, d)


@cases((H,))
def config_object_branches(h):
    out = F.layer_norm(h, (CONFIG.hidden,), eps=CONFIG.eps)
    if CONFIG.use_cache:
        return out, None
    return F.gelu(out) if CONFIG.act == "gelu" else F.relu(out)


@cases((H,))
def manual_layer_norm(h):
    mean = h.mean(-1, keepdim=True)
    var = (h - mean).pow(2).mean(-1, keepdim=True)
    return (h - mean) * torch.rsqrt(var + 1e-5)


@cases((H,))
def rms_norm(h):
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)


@cases((H,))
def gelu_tanh_approximation(h):
    return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))


@cases((t(2, 4, 8),))
def rotary_embedding(x):
    half = x.shape[-1] // 2
    freqs = 1.0 / (10000 ** (torch.arange(0, half, dtype=torch.float32) / half))
    angles = torch.arange(x.shape[1], dtype=torch.float32)[:, None] * freqs[None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()], -1)


@cases((t(3, 5), torch.tensor([1, 0, 4])))
def cross_entropy_loss(logits, target):
    return F.cross_entropy(logits, target), F.nll_loss(logits.log_softmax(-1), target, reduction="sum")


@cases((t(3, 5), torch.tensor([1, -100, 4])))
def cross_entropy_ignore_index(logits, target):
    return F.cross_entropy(logits, target, ignore_index=-100)


@cases((t(4), t(4)))
def regression_losses(a, b):
    return F.mse_loss(a, b), F.l1_loss(a, b), F.smooth_l1_loss(a, b), F.binary_cross_entropy_with_logits(a, b.sigmoid())


@cases((t(4, grad=True), t(4)))
def sgd_momentum_style_update(p, g):
    with torch.no_grad():
        buf = g.clone()
        buf.mul_(0.9).add_(g)
        new = p - 0.1 * buf
    return new


@cases((t(4), t(4), t(4)))
def adam_style_update_in_place(p, m, v):
    g = p * 0.5
    m.mul_(0.9).add_(g, alpha=0.1)
    v.mul_(0.999).addcmul_(g, g, value=0.001)
    p.addcdiv_(m, v.sqrt().add_(1e-8), value=-0.01)
    return p


@cases((t(2, 4),))
def clip_grad_norm_style(x):
    norm = x.norm(2)
    coef = torch.clamp(1.0 / (norm + 1e-6), max=1.0)
    return x * coef


@cases((t(2, 3, 4),))
def pad_and_unfold(x):
    return F.pad(x, (1, 2)), F.pad(x, (0, 0, 1, 1), value=-1.0), x.unfold(2, 2, 2)


@cases((t(1, 2, 4, 4),))
def pooling_and_interpolate(x):
    return F.max_pool2d(x, 2), F.avg_pool2d(x, 2, padding=1), F.interpolate(x, scale_factor=2, mode="nearest")


@cases((t(1, 2, 5, 5), t(3, 2, 3, 3)))
def conv_functional(x, w):
    return F.conv2d(x, w, padding=1), F.conv2d(x, w, stride=2)


@cases((t(4, 3),))
def one_hot_and_argmax(x):
    return F.one_hot(x.argmax(1), 3), F.one_hot(torch.tensor([0, 2]), num_classes=4)


@cases((t(4, 3),))
def topk_gather_pattern(x):
    vals, idx = x.topk(2, dim=1)
    return torch.zeros_like(x).scatter(1, idx, vals)


@cases((t(5), torch.tensor([0, 1, 0, 2, 1])))
def index_add_and_scatter_reduce(src, idx):
    return torch.zeros(3).index_add(0, idx, src), torch.zeros(3).scatter_reduce(0, idx, src, "amax", include_self=False)


@cases((A,))
def masked_select_data_dependent(a):
    return a[a > 0].sum(), a.masked_select(a < 0).numel()


@cases((A,))
def nonzero_data_dependent(a):
    return (a > 0).nonzero()


@cases((A,))
def len_of_masked_tensor(a):
    return len(a[a > 0]) * a


@cases((A,))
def unique_and_bincount(a):
    ints = (a * 2).round().clamp(0, 3).long()
    return torch.unique(ints), torch.bincount(ints, minlength=4)


@cases((A,))
def seeded_random_ops(a):
    torch.manual_seed(7)
    return a + torch.rand(6), torch.randn(2, 3), torch.randint(0, 5, (3,))


@cases((A,))
def dropout_under_seed(a):
    torch.manual_seed(1)
    return F.dropout(a, 0.5, training=True)


@cases((A,))
def dropout_not_training(a):
    return F.dropout(a, 0.5, training=False)


@cases((t(6, dtype=torch.float64),))
def float64_precision(a):
    return (a * 1e-8 + 1.0) - 1.0, a.exp().log()


@cases((torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.0]),))
def special_float_values(a):
    return torch.isnan(a), torch.isinf(a), a.nan_to_num(0.0), torch.sign(a), a.clamp(-1, 1)


@cases((torch.tensor([-7, -1, 0, 3, 9]),))
def integer_division_signs(n):
    return n // 2, n % 3, torch.div(n, -2, rounding_mode="trunc"), torch.remainder(n, -4), torch.fmod(n, 4)


@cases((torch.tensor([2 ** 62, -(2 ** 62), 7]),))
def large_integer_values(n):
    return n + 1, n * 2 // 4, n.abs()


@cases((t(6, dtype=torch.bfloat16),))
def bfloat16_ops(a):
    return a * 2 + 1, a.float().sum(), a.softmax(0)


@cases((t(6, dtype=torch.float16),))
def float16_ops(a):
    return (a * a).float(), a.to(torch.float32).mean()


@cases((torch.tensor([True, False, True]),))
def bool_arithmetic(mask):
    return mask.sum(), mask.float().mean(), mask.long() * 3, mask.any(), torch.where(mask, 1, -1)


@cases((t(3, 4),))
def complex_numbers(x):
    c = torch.complex(x, -x)
    return c.abs(), c.real * 2, torch.view_as_real(c)


@cases((t(2, 3, 4),))
def einsum_patterns(x):
    return torch.einsum("bij->bji", x), torch.einsum("bij,bkj->bik", x, x), torch.einsum("...j->...", x)


@cases((t(4, 4),))
def linalg_small(x):
    sym = x @ x.t() + torch.eye(4) * 4
    return torch.linalg.norm(x), torch.linalg.cholesky(sym), torch.linalg.inv(sym) @ sym


@cases((t(2, 5),))
def sort_and_cumsum_top_p(logits):
    probs, idx = logits.softmax(-1).sort(descending=True)
    keep = probs.cumsum(-1) < 0.9
    return probs * keep, idx


@cases((t(3, 4), t(3, 4)))
def cosine_and_pairwise(a, b):
    return F.cosine_similarity(a, b), torch.cdist(a, b), F.pairwise_distance(a, b)


@cases((t(2, 3), t(2, 3)))
def tensor_list_stack_in_loop(a, b):
    outs = []
    for _step in range(3):
        a = torch.tanh(a @ torch.ones(3, 3) * 0.1 + b)
        outs.append(a)
    return torch.stack(outs, 1)


@cases((t(4, 3),))
def new_methods_follow_input(x):
    return x.new_zeros(2), x.new_full((2,), 3.0), x.new_tensor([1.0, 2.0]), x.new_empty(0).numel()


@cases((t(2, 3),))
def triangular_and_diag(x):
    sq = x @ x.t()
    return torch.tril(sq), torch.triu(sq, 1), torch.diag(sq), torch.diagonal(sq).sum()


@cases((t(5),))
def sorted_python_list_of_tensors(a):
    parts = [a[i] for i in range(3)]
    return torch.stack(parts).max(), torch.stack(sorted(parts, key=lambda v: -v.item()))


@pytest.mark.parametrize("fn, calls, options", cases.params)
def test_repro_case_matches_eager(fn, calls, options):
    check(fn, *calls, **options)


THROUGH_AUTOGRAD_STAGE = {
    "scaled_dot_product_scores": (), "causal_mask_with_finfo_min": (), "rotary_embedding": (),
    "cross_entropy_loss": (), "adam_style_update_in_place": (),
    "masked_select_data_dependent": (), "nonzero_data_dependent": (), "unique_and_bincount": (),
    "seeded_random_ops": (), "special_float_values": (), "integer_division_signs": (), "complex_numbers": (),
    "sort_and_cumsum_top_p": (), "pad_and_unfold": (),
}


@pytest.mark.parametrize("fn, calls, options", [pytest.param(*p.values, id=p.id, marks=THROUGH_AUTOGRAD_STAGE[p.id])
                                                for p in cases.params if p.id in THROUGH_AUTOGRAD_STAGE])
def test_repro_case_through_autograd_stage(fn, calls, options):
    check(fn, *calls, backend="aot_eager", **options)
