"""The code generator's decomposition table: what kiln's inductor decomposes before lowering.

The default backend passes `decomposition_table()` to `aot_compile`; the autograd stage
adjusts it while tracing (autograd/decompositions.py: the ops functionalization needs,
and the ops unsafe to decompose in training), so this module owns only the code
generator's choice.

PyTorch's core-ATen decompositions, plus the composite ops that the core set
keeps but that kiln would rather see as pointwise ops and reductions (so they
fuse): GELU, LayerNorm, softmax and their backwards, and friends. Ops we lower
directly or run as fast externs (addmm, convolution) are left alone, except that
a convolution's bias is taken out of it (`OWN`), forward and backward, so that
it fuses with the ops around the convolution.
"""
from __future__ import annotations

import functools
import math

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

from kiln.lower.eager_moments import group_norm_as_eager, layer_norm_as_eager
from kiln.lower.foreach import FOREACH_DECOMPOSITIONS
from kiln.lower.ops.scatters import DENSE_LIMIT
from kiln.lower.special_decompositions import SPECIAL_DECOMPOSITIONS

aten = torch.ops.aten


@functools.cache
def _core_table():
    """PyTorch's core-ATen decomposition table, read-only here, made once per process: each
    `core_aten_decompositions()` call builds it anew from every registered op (a tenth of a CPU second), which this
    module's import and its first `decomposition_table()` paid four times in every process."""
    return core_aten_decompositions()

# Composite ops that the core table keeps but that fuse better as their parts.
EXTRA = [
    aten.gelu, aten.gelu_backward,
    aten.native_layer_norm, aten.native_layer_norm_backward,
    aten._softmax, aten._log_softmax, aten._softmax_backward_data, aten._log_softmax_backward_data,
    aten.silu, aten.silu_backward, aten.hardswish, aten.hardsigmoid, aten.mish,
    aten.sigmoid_backward, aten.tanh_backward, aten.threshold_backward,
    aten.mse_loss, aten.mse_loss_backward, aten.leaky_relu, aten.elu, aten.softplus,
    aten.hardtanh, aten.addcmul, aten.addcdiv, aten.lerp, aten.rsub, aten.std, aten.var,
    aten.native_batch_norm, aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit_no_training, aten.native_batch_norm_backward,
    aten.native_group_norm, aten.native_group_norm_backward,
    aten.linalg_vector_norm,  # a reduction of pointwise ops (abs, pow), fused with what it reads
    aten._adaptive_avg_pool2d,  # average pooling where sizes divide, else sums over gathered windows
]

# Kept whole: each is one fast ATen call, lowered as it is, or decomposed wrongly.
KEEP = [
    aten.addmm.default, aten.mm.default, aten.bmm.default, aten.convolution.default,
    aten.convolution_backward.default, aten.var_mean.correction, aten.var.correction,
    # eager takes the square root in the dtype it accumulates the variance in (double on the CPU): a float32
    # variance that overflows float32 still has a finite standard deviation
    aten.std.correction, aten.std_mean.correction,
    aten.mean.dim, aten.clamp.default, aten.clamp.Tensor,
    # the decompositions (index_put) wrap negative indices and raise IndexError where eager raises
    # RuntimeError (index_add) or rejects negative indices (index_add, index_copy); index_fill, which
    # wraps them, decomposes into index_copy
    aten.index_add.default, aten.index_copy.default, aten.index_fill.int_Scalar, aten.index_fill.int_Tensor,
    # fused attention: one kernel (flash / memory-efficient / cuDNN) where the decomposition
    # materializes the score matrix (benchmarks/results/models_bench: BERT inference); for the CPU variant
    # the decomposition also returns the attention weights where the op returns logsumexp,
    # which the backward (flash attention backward) then misreads
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    # ATen's kernel sorts the indices and sums each row's gradients in one pass; the decomposition's
    # index_put(accumulate=True) runs ATen's generic accumulate path, many times slower on the GPU for a
    # language model's vocabulary (benchmarks/results/zoo: T5 training)
    aten.embedding_dense_backward.default,
    # eager's kernels check the values they read lie in [0, 1] (binary cross-entropy's input, bernoulli's tensor
    # of probabilities) and raise; the decompositions (log and clamp, `rand_like(p) < p`) return numbers
    aten.binary_cross_entropy.default, aten.bernoulli.default,
]


def convolution_bias_apart(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """A convolution with a bias as the convolution without it, then the bias added per channel.

    ATen adds a cuDNN convolution's bias in a pass of its own (a launch, the whole output read and
    written again); as a pointwise add it fuses into whatever kernel reads the convolution (its ReLU,
    its pooling). The result is eager's: both round the convolution, then the sum, to the output dtype."""
    if bias is None:
        return NotImplemented
    out = aten.convolution.default(input, weight, None, stride, padding, dilation, transposed, output_padding, groups)
    return out + bias.reshape([1, -1] + [1] * (out.dim() - 2))


def convolution_backward_bias_apart(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                                    output_padding, groups, output_mask):
    """The bias gradient (the output gradient summed over every dim but the channels) as a reduction that
    fuses into the kernel computing the output gradient, rather than a reduction ATen launches alone."""
    if not output_mask[2]:
        return NotImplemented
    grad_bias = grad_output.sum([0] + list(range(2, grad_output.dim())))
    if not (output_mask[0] or output_mask[1]):
        return None, None, grad_bias
    grad_input, grad_weight, _ = aten.convolution_backward.default(
        grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
        [output_mask[0], output_mask[1], False])
    return grad_input, grad_weight, grad_bias


def vector_norm_over_positive_dims(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """torch's reference decomposition, given `dim` with negative dims made positive.

    torch 2.11's reference compares raw dims when every reduced dim has size 1, so `a.norm(dim=-1)` of a
    (5, 1) tensor kept both dims there (a silent wrong shape); with positive dims every version agrees."""
    if dim is not None:
        dims = [dim] if isinstance(dim, int) else dim
        dim = [d % max(x.dim(), 1) for d in dims]
    return _REFERENCE_VECTOR_NORM(x, ord, dim, keepdim, dtype=dtype)


_REFERENCE_VECTOR_NORM = get_decompositions([aten.linalg_vector_norm.default])[aten.linalg_vector_norm.default]


# dtypes the products-and-sums decompositions apply to (`FULL_PRECISION_ONLY`)
FULL_PRECISION = (torch.float32, torch.float64)


def addbmm_as_bmm_and_sum(self, batch1, batch2, *, beta=1, alpha=1):
    """beta * self + alpha * (the sum over the batch of batch1 @ batch2): the batched product stays one ATen
    call (an extern by design) and the sum over the batch, the scaling and the add fuse into one kernel, where
    ATen's addbmm is an extern of its own. float32 and float64 only: an integer sum would widen to int64, and
    bmm rounds each product to a half type where ATen's addbmm accumulates the batch before rounding."""
    if self.dtype not in FULL_PRECISION:
        return NotImplemented
    total = aten.sum.dim_IntList(aten.bmm.default(batch1, batch2), [0])
    if alpha != 1:
        total = total * alpha
    if beta == 0:  # self is ignored, NaN and all, as eager ignores it (the result has the product's shape)
        return total
    return (self * beta if beta != 1 else self) + total


def trilinear_as_product_and_sum(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """ATen's _trilinear (bilinear layers): each input unsqueezed at its `expand` dims, the three multiplied and
    summed over `sumdim`, a reduction that fuses its product where ATen chains batched matmuls of
    permuted copies. float32 and float64 only (a half type would round each product where the matmuls
    accumulate them in float32)."""
    if i1.dtype not in FULL_PRECISION:
        return NotImplemented
    total = i1.dim() + len(expand1)
    operands = []
    for t, expand in ((i1, expand1), (i2, expand2), (i3, expand3)):
        for d in range(total):
            if d in expand:
                t = aten.unsqueeze.default(t, d)
        operands.append(t)
    product = operands[0] * operands[1] * operands[2]
    return aten.sum.dim_IntList(product, list(sumdim)) if sumdim else product


def _nearest_indices(output_size, input_size, scales, exact: bool, device) -> list:
    """For each spatial dim, the input index each output index reads, as eager's nearest kernel computes it
    (floor of the output index, plus one half if `exact`, times the float32 scale), shaped to broadcast."""
    indices, n = [], len(output_size)
    for d, (osize, isize) in enumerate(zip(output_size, input_size[-n:])):
        scale = scales[d] if d < len(scales) else None  # absent when the call passed no scales
        scale = isize / (isize * scale) if scale is not None and scale > 0 else isize / osize
        index = ((torch.arange(osize, dtype=torch.float32, device=device) + (0.5 if exact else 0.0)) * scale)
        indices.append(index.to(torch.int64).reshape([osize] + [1] * (n - 1 - d)))
    return indices


def _upsample_nearest_backward(exact: bool):
    def decomposition(grad_output, output_size, input_size, *scales):
        """The input's gradient sums the output gradients of the elements that read each input element: an
        accumulating index_put of them at the forward's indices (a dense reduction, kiln/lower/ops/scatters.py).
        Where that reduction would cost more than DENSE_LIMIT compares, ATen's own backward kernel stays."""
        if math.prod(input_size) * math.prod(output_size) > DENSE_LIMIT:
            return NotImplemented
        indices = _nearest_indices(output_size, input_size, scales, exact, grad_output.device)
        zeros = grad_output.new_zeros(input_size)
        return aten.index_put.default(zeros, [None, None, *indices], grad_output, True)
    return decomposition


def _scalar_tensors_cast(op):
    """`op`'s core decomposition, with each 0-d tensor operand of another dtype than the result cast to it first,
    where the result is bf16/fp16: eager's kernels read `addcmul(h, h, s)`'s 0-d float32 `s` as half(s) (the
    CPU's TensorIterator casts it; CUDA's functors take the half type, whether `s` is on the CPU or the GPU), and
    the decomposition, computing in float32, would read it at its value."""
    decompose = _core_table()[op]

    def decomposition(*args, **kwargs):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        dtype = _dimensioned_dtype(tensors)
        if dtype in (torch.float16, torch.bfloat16):
            args = tuple(a.to(dtype) if _scalar_tensor_of_lower_category(a, dtype) else a for a in args)
        return decompose(*args, **kwargs)
    return decomposition


def _xlogy_scalars_cast_on_cuda(op):
    """`xlogy`'s core decomposition, with each scalar operand (a Python number, a 0-d tensor of another dtype)
    cast to the result's dtype first, where the result is bf16/fp16 on a CUDA device: CUDA's kernel reads
    `xlogy(h, 0.3)` as `xlogy(h, half(0.3))`, and the decomposition, computing in float32, would read 0.3 at its
    value. The CPU's kernel reads them neither way throughout, and keeps the core decomposition."""
    decompose = _core_table()[op]

    def decomposition(self, other):
        tensors = [a for a in (self, other) if isinstance(a, torch.Tensor)]
        dtype = _dimensioned_dtype(tensors)
        device = next((t.device for t in tensors if t.device.type == "cuda"), None)
        if dtype not in (torch.float16, torch.bfloat16) or device is None:
            return decompose(self, other)
        self, other = (_half_operand(a, dtype, device) for a in (self, other))
        return _core_table()[aten.xlogy.Tensor](self, other)
    return decomposition


def _half_operand(a, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`a` as a tensor holding the values of `dtype` it converts to, where it is a number or a 0-d tensor of a
    lower category; a tensor of `dtype` as it is."""
    if not isinstance(a, torch.Tensor):
        return torch.scalar_tensor(a, dtype=dtype, device=device)
    return a.to(dtype) if _scalar_tensor_of_lower_category(a, dtype) else a


def _dimensioned_dtype(tensors: list) -> torch.dtype | None:
    """The promoted dtype of the tensors with dims (None if all are 0-d): the result's, where no 0-d tensor is of
    a higher category (a complex scalar)."""
    dims = [t.dtype for t in tensors if t.dim() > 0]
    return functools.reduce(torch.promote_types, dims) if dims else None


def _scalar_tensor_of_lower_category(a, dtype: torch.dtype) -> bool:
    return isinstance(a, torch.Tensor) and a.dim() == 0 and a.dtype != dtype and not a.is_complex()


def _batch_norm_inference_as_eager(decompose, training_at=None):
    """Batch norm with running statistics, `decompose` (torch's decomposition) with the output computed as eager's
    CPU kernel computes it (batch_norm_cpu_collect_linear_and_constant_terms, then the transform), where torch's
    `(x - mean) * invstd * weight + bias` rounds otherwise, an ulp off in a third of the elements:

    - per channel, in the math type (float for half types): invstd = 1 / sqrt(var + eps), alpha = invstd * weight,
      beta = bias - mean * alpha;
    - out = x * alpha + beta, rounded to the input's dtype.

    GCC contracts eager's `bias - mean * alpha` and `x * alpha + beta` into fused multiply-adds (one rounding);
    kiln's kernels are built without contraction, so a float32 fma is computed in float64 (the product is exact
    there) and rounded to float32. `training_at`: the position of the op's `training` argument, where it has one
    (in training the op decomposes as torch's)."""
    def decomposition(*args):
        input, weight, bias, running_mean, running_var = args[:5]
        if (training_at is not None and args[training_at]) or input.device.type != "cpu" or running_var is None:
            return decompose(*args)
        _, *statistics = decompose(*args)  # the empty saved mean and invstd, as eager returns them
        math = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
        invstd = 1 / torch.sqrt(running_var.to(math) + args[-1])
        alpha = invstd * weight.to(math) if weight is not None else invstd
        bias = bias.to(math) if bias is not None else torch.zeros_like(alpha)
        beta = _fused_multiply_add(-running_mean.to(math), alpha, bias, math)
        shape = [1, -1] + [1] * (input.dim() - 2)
        out = _fused_multiply_add(input.to(math), alpha.reshape(shape), beta.reshape(shape), math)
        return (out.to(input.dtype), *statistics)
    return decomposition


_TORCH_LEGIT_BATCH_NORM = get_decompositions([aten._native_batch_norm_legit])[aten._native_batch_norm_legit.default]


def _legit_without_training(input, weight, bias, running_mean, running_var, momentum, eps):
    """torch's decomposition of `_native_batch_norm_legit_no_training`, called as the function its op dispatches
    to. Through the op, tracing a training graph looped: the autograd stage's table takes
    `_native_batch_norm_legit(training=False)` back to `_native_batch_norm_legit_no_training`
    (autograd/decompositions.py), until Python's stack ran out."""
    return _TORCH_LEGIT_BATCH_NORM(input, weight, bias, running_mean, running_var, False, momentum, eps)


def take_as_index(self, index):
    """`self.reshape(-1)[index]` as one index op. torch's decomposition subscripts with the index tensor, and
    Python reads a 0-dim integer index as an int (its value: `.item()`), which a trace cannot: the graph ran op by
    op (the OpInfo rows of `take`)."""
    return aten.index.Tensor(self.reshape(-1), [index])


def put_accumulating_as_index_put(self, index, source, accumulate=False):
    """`put` with `accumulate` (`take`'s backward) as an accumulating `index_put` on the flattened input, which
    kiln lowers; without it, duplicate indices keep whichever write ATen's kernel makes last, and the op stays."""
    if not accumulate:
        return NotImplemented
    return aten.index_put.default(self.reshape(-1), [index.reshape(-1)], source.reshape(-1), True).view(self.shape)


def _fused_multiply_add(a, b, c, math: torch.dtype):
    """a * b + c rounded once to `math`, as an fma computes it: float32 through float64 (where the product of two
    float32 values is exact); float64 as two roundings (no wider type here)."""
    if math != torch.float32:
        return a * b + c
    return (a.to(torch.float64) * b.to(torch.float64) + c.to(torch.float64)).to(math)


# kiln's own decompositions: each returns NotImplemented where it does not apply (no bias), and the op stays.
OWN = {
    **{op: _scalar_tensors_cast(op) for op in (aten.lerp.Tensor, aten.addcmul.default, aten.addcdiv.default)},
    **{op: _xlogy_scalars_cast_on_cuda(op)
       for op in (aten.xlogy.Tensor, aten.xlogy.Scalar_Other, aten.xlogy.Scalar_Self)},
    aten.convolution.default: convolution_bias_apart,
    aten.convolution_backward.default: convolution_backward_bias_apart,
    aten.linalg_vector_norm.default: vector_norm_over_positive_dims,
    aten.addbmm.default: addbmm_as_bmm_and_sum,
    aten._trilinear.default: trilinear_as_product_and_sum,
    aten.take.default: take_as_index,
    aten.put.default: put_accumulating_as_index_put,
    aten._native_batch_norm_legit_no_training.default: _batch_norm_inference_as_eager(_legit_without_training),
    aten.native_batch_norm.default: _batch_norm_inference_as_eager(
        get_decompositions([aten.native_batch_norm])[aten.native_batch_norm.default], training_at=5),
    # the rows whose statistics eager's CPU kernel makes NaN (an overflowed square times an empty merge's count)
    aten.native_layer_norm.default: layer_norm_as_eager(
        get_decompositions([aten.native_layer_norm])[aten.native_layer_norm.default]),
    aten.native_group_norm.default: group_norm_as_eager(
        get_decompositions([aten.native_group_norm])[aten.native_group_norm.default]),

    **{op: _upsample_nearest_backward(exact=False) for op in (
        aten.upsample_nearest1d_backward.default, aten.upsample_nearest2d_backward.default,
        aten.upsample_nearest3d_backward.default)},
    **{op: _upsample_nearest_backward(exact=True) for op in (
        aten._upsample_nearest_exact1d_backward.default, aten._upsample_nearest_exact2d_backward.default,
        aten._upsample_nearest_exact3d_backward.default)},
}
FULL_PRECISION_ONLY = (aten.addbmm.default, aten._trilinear.default)


@functools.lru_cache(None)
def decomposition_table(fallback_random: bool = False) -> dict:
    """OpOverload -> decomposition, as passed to make_fx / aot_compile.

    `fallback_random` (the option): no random op is decomposed. A decomposition draws its randomness its
    own way (`bernoulli(p)` as `rand_like(p) < p`, attention's dropout as a mask from `rand`), which on
    some devices is not the stream eager's kernel draws; kept whole, each random op is the ATen call eager
    makes, run as an extern in graph order, so the same seed gives eager's values bit for bit."""
    table = dict(_core_table())
    table.update(get_decompositions(EXTRA))
    for op in KEEP:
        table.pop(op, None)
    table.update(OWN)
    table.update(SPECIAL_DECOMPOSITIONS)
    table.update(FOREACH_DECOMPOSITIONS)
    if fallback_random:
        table = {op: fn for op, fn in table.items() if not is_random(op)}
    return table


def is_random(op) -> bool:
    """Does `op` draw from a random generator (ATen's `nondeterministic_seeded` tag)?"""
    return torch.Tag.nondeterministic_seeded in getattr(op, "tags", ())


def decomposes(node, fallback_random: bool = False) -> bool:
    """Would tracing FX `node` through `decomposition_table()` replace it (a convolution without a bias stays)?"""
    if node.target is aten.convolution.default:
        return node.args[2] is not None
    if node.target is aten.convolution_backward.default:
        return bool(node.args[10][2])
    if node.target in FULL_PRECISION_ONLY:
        return node.meta["val"].dtype in FULL_PRECISION
    return node.target in decomposition_table(fallback_random)
