"""Attention. mtf lays the attention logits out like q ([batch, sequence, heads, memory]), so TF's einsum
transposes them inside every attention matmul, forward and backward. `attention` transposes q, k, v once so
that every einsum is a plain batched matmul, and uses one softmax kernel with an XLA-fused gradient (attention
einsums 3x faster); `local_attention_1d` is mtf's blocked local attention on top of it. The softmax needs the
memory dimension whole on each device; where the layout splits it, the caller says so (`memory_split`) and
the softmax is mtf's, which reduces across devices."""
from __future__ import annotations

import weakref

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from models.kernels.common import MASKED, compiled, f32, xla_function


def local_attention_block_length(n_ctx: int, radius: int) -> int:
    """The block length local attention cuts the sequence into (mesh-tensorflow's local_attention_1d rule):
    the largest divisor of n_ctx not above max(radius, 128)."""
    block_length = max(radius, 128)
    while n_ctx % block_length:
        block_length -= 1
    return block_length


def local_attention_blocks(n_ctx: int, radius: int) -> int:
    """How many blocks local attention cuts the sequence into: the blocks keep the name 'sequence', so a
    layout that splits 'sequence' splits them."""
    return n_ctx // local_attention_block_length(n_ctx, radius)


@xla_function
def _softmax_backward(y, dy):
    dtype, y, dy = y.dtype, f32(y), f32(dy)
    return tf.cast((dy - tf.reduce_sum(dy * y, axis=-1, keepdims=True)) * y, dtype)


def softmax(logits: mtf.Tensor, dim: mtf.Dimension, split: bool) -> mtf.Tensor:
    """Softmax over `dim` (the last dimension), one tf.nn.softmax per slice and an XLA-fused gradient, instead
    of mtf.softmax's exp(x - logsumexp(x)) chain (a dozen passes forward and backward). `split`: the layout
    splits `dim` (then mtf.softmax, which reduces across the split)."""
    if split or logits.shape.dims[-1] != dim:
        return mtf.softmax(logits, dim)
    splittable = [d for d in logits.shape.dims if d != dim]

    def grad_function(op, dy):
        y = op.outputs[0]
        dx = mtf.slicewise(lambda y_, dy_: compiled(_softmax_backward, y_, dy_), [y, dy], output_shape=y.shape,
                           output_dtype=y.dtype, splittable_dims=splittable, grad_function=0, name="softmax_grad")
        return [dx]

    return mtf.slicewise(lambda x: tf.nn.softmax(x, axis=-1), [logits], output_shape=logits.shape,
                         output_dtype=logits.dtype, splittable_dims=splittable, grad_function=grad_function,
                         name="softmax")


def laid_out(x: mtf.Tensor, dims: list) -> mtf.Tensor:
    """x with its dimensions in the order `dims`: transposed, unless they already are (models/attention.py
    projects q, k and v in this layout)."""
    return x if x.shape.dims == dims else mtf.transpose(x, dims)


def attention(q, k, v, memory_length_dim, key_dim, value_dim, bias=None, dropout_rate=0.0, context=None,
              memory_split: bool = False) -> mtf.Tensor:
    """mesh-tensorflow's `transformer.attention.attention` (fp32 logits, bias, softmax over memory, dropout,
    weighted values), with the logits laid out [shared dims (batch, heads, ...), query dims, memory].

    mtf orders the logits like q ([batch, sequence, heads, memory]), so every attention einsum, forward and
    backward, makes TF transpose the [.., sequence, memory]-sized tensor to reach a batched matmul. Here q, k,
    v are transposed once to [batch, heads, length, features] and every einsum is a plain batched matmul
    (2x faster on the benchmark model); the softmax runs over the last dimension."""
    output_shape = q.shape - key_dim + value_dim
    shared = [d for d in q.shape.dims if d in k.shape.dims and d != key_dim]
    query_only = [d for d in q.shape.dims if d not in k.shape.dims]
    # Explicit transposes, once: [shared..., length, features] for q and k, [shared..., features, memory] for v.
    # Then each einsum here and in mtf's gradients (which put the output gradient first) is a batched matmul
    # whose result needs no transpose; TF's einsum would otherwise transpose inside every call, slower.
    q = laid_out(mtf.cast(q, tf.float32), shared + query_only + [key_dim])
    k = laid_out(mtf.cast(k, tf.float32), shared + [memory_length_dim, key_dim])
    v = laid_out(v, shared + [value_dim, memory_length_dim])
    logits = mtf.einsum([q, k], output_shape=mtf.Shape(shared + query_only + [memory_length_dim]))
    if bias is not None:
        logits += mtf.cast(bias, logits.dtype)
    weights = mtf.cast(softmax(logits, memory_length_dim, memory_split), v.dtype)
    if context is not None and context.train and dropout_rate > 0:
        weights = mtf.dropout(weights, is_training=True, rate=dropout_rate)
    out = mtf.einsum([weights, v], output_shape=mtf.Shape(shared + query_only + [value_dim]))
    return laid_out(out, output_shape.dims)


# Contexts above this recompute the softmax weights in the backward pass instead of keeping them (_causal_blocks).
KEEPS_WEIGHTS_UP_TO = 2048
# The longest query block: one block's fp32 weights, [block, keys] per head, are the kernel's working set.
MAX_BLOCK_LENGTH = 256


def causal_block_length(n_ctx: int, radius: int | None = None) -> int:
    """The query block length of `causal_attention`: the largest divisor of n_ctx not above max(64, n_ctx / 8)
    for global attention (256 at GPT-Neo's 2048: 8 blocks, 36 of the square's 64 block pairs computed; 64 at
    context 256, where 128-query blocks computed 3/4 of the square and trained 1% slower), not above
    max(64, radius / 2) for a window of `radius` (128 at GPT-Neo's 256: each block reads 383 keys, not mtf's 512);
    never above MAX_BLOCK_LENGTH, so that one block's weights stay small at long contexts (at 32768, 256 queries
    by 32768 keys by 12 heads in fp32 are 400 MB)."""
    block_length = max(64, n_ctx // 8) if radius is None else max(64, radius // 2)
    block_length = min(block_length, n_ctx, MAX_BLOCK_LENGTH)
    while n_ctx % block_length:
        block_length -= 1
    return block_length


def causal_blocks_pay(n_ctx: int, radius: int | None = None) -> bool:
    """Whether `causal_attention` has at least two blocks of at least 64 queries (a prime length has none)."""
    block_length = causal_block_length(n_ctx, radius)
    return block_length >= 64 and n_ctx >= 2 * block_length


def _visible_keys(start: int, end: int, radius: int | None) -> int:
    """The first key any query in [start, end) sees: 0, or the window's start for the first of them."""
    return 0 if radius is None else max(0, start - radius + 1)


@xla_function
def _softmax_backward_as(y, dy, dtype):
    """`_softmax_backward` computed in fp32 for weights `y` (recomputed in fp32, or kept in the activations' dtype)
    and their gradient `dy`, stored in `dtype` (the dtype of q and k, which the logits' gradient is multiplied with
    next)."""
    y, dy = f32(y), f32(dy)
    return tf.cast((dy - tf.reduce_sum(dy * y, axis=-1, keepdims=True)) * y, dtype)


def _rows(x, first: int, end: int):
    """x[..., first:end, :] as one Slice (a StridedSlice takes a constant more; the blocks' slices were a tenth of
    125M's training graph), or x itself when that is all of it."""
    if first == 0 and end == x.shape.as_list()[-2]:
        return x
    rank = len(x.shape)
    return tf.slice(x, [0] * (rank - 2) + [first, 0], [-1] * (rank - 2) + [end - first, -1])


def _mask(start: int, end: int, first: int, radius: int | None):
    """[end - start, end - first]: 0 where query start + i sees key first + j, MASKED elsewhere."""
    offset = tf.range(first, end)[None, :] - tf.range(start, end)[:, None]
    seen = offset <= 0 if radius is None else tf.logical_and(offset <= 0, offset > -radius)
    return tf.where(seen, tf.zeros(tf.shape(offset)), tf.fill(tf.shape(offset), MASKED))


# The blocks' masks of each graph, made once per device, block and control-flow context (a TF 1 while loop's body,
# as TPU programs lower the step in, cannot read a tensor made in another loop's) and read by every layer: ~20 ops
# a block, which every layer made again (a sixth of 125M's training graph at context 2048). Held by name: a
# tensor (or a loop's context) would hold its graph, which the weak key would then never let go. Only where the
# weights are kept: recomputing contexts (long ones) keep one block's mask at a time, not all of them.
_MASKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _shared_mask(device: str, start: int, end: int, first: int, radius: int | None):
    graph = tf.get_default_graph()
    context_of = getattr(graph, "_get_control_flow_context", None)  # private (docs/repository.md)
    if context_of is None:  # which loop the op is made in cannot be told: each layer makes its own
        return _mask(start, end, first, radius)
    context = context_of()
    masks = _MASKS.setdefault(graph, {})
    key = (device, None if context is None else context.name, start, end, first, radius)
    if key not in masks:
        masks[key] = _mask(start, end, first, radius).name
    return graph.get_tensor_by_name(masks[key])


def _causal_blocks(q, k, v, block_length: int, radius: int | None, recompute: bool):
    """One device's causal attention: q, k [..., length, key], v [..., length, value], all in the activations'
    dtype. Each block of queries against only the keys some query of it sees: from 0 (global) or the window's
    start (`radius`) to the block's own end, masked where a query does not see a key.

    The logits are fp32 products (q and k cast once; their softmax in fp32), as mtf's attention computes them.
    Without `recompute`, each block's softmax weights are kept for the backward pass in v's dtype only, the one
    the product with v takes (2 bytes per query-key pair and head under bf16). With it (causal_attention: contexts
    above KEEPS_WEIGHTS_UP_TO) nothing but q, k and v is kept: the backward pass recomputes each block's logits
    (one more product per block) and their softmax, one block at a time, so attention's memory grows linearly
    with the context (the kept weights of 125M's global layers take 5 GiB at context 8192 in bf16, 21 GiB at
    16384). Flash attention keeps each row's log-sum-exp and recomputes the weights as exp(logits - lse); TF's
    oneDNN softmax recomputed them faster than an XLA kernel's exp from kept statistics (a global layer's attention
    forward and backward at context 2048, bf16, one core: 189 ms keeping the weights, 263 recomputing them with
    the softmax, more with the log-sum-exp), which is also why short contexts keep them.
    The backward pass's products take their operands in the activations' dtype, as every other gradient product
    does under bf16: the fused softmax gradient (computed in fp32) stores the logits' gradient in it, and
    multiplies it and the weights with q, k and the output's gradient as they came (at bf16, oneDNN's bf16
    kernels, several times fp32's rate on CPUs with bf16 units).

    The gradient is written out (TF's own would pad every block's key and value gradients to the whole length
    and add them up: at context 2048 that cost a tenth of the step). Going back from the last block, the key and
    value gradients of the keys block i reads are carried (fp32) and summed; the keys from block i's start on are
    final once block i is done (no earlier query block sees them), and the rest is carried on to block i - 1,
    whose keys begin at the same place or earlier."""
    length = q.shape.as_list()[-2]
    spans = [(start, start + block_length, _visible_keys(start, start + block_length, radius))
             for start in range(0, length, block_length)]

    def blocks_of(x):  # x's query blocks, one Split
        return tf.split(x, len(spans), axis=-2) if len(spans) > 1 else [x]

    def mask(start, end, first):
        return _mask(start, end, first, radius) if recompute else _shared_mask(q.device, start, end, first, radius)

    def softmax(q32_block, k32, start, end, first):  # the block's fp32 softmax weights [.., block, keys]
        logits = tf.matmul(q32_block, _rows(k32, first, end), transpose_b=True)
        return tf.nn.softmax(logits + mask(start, end, first), axis=-1)

    def one_at_a_time(after):
        """When recomputing, each block's ops (slices included) wait for `after`, the block before's results: only
        one block's weights exist at once. TF's executor would otherwise run every block's ops the moment their
        inputs exist and leave some (a block's query gradient, nothing needs it till the end) for later, holding
        their inputs (its weights' gradient, slices that share a carry's buffer) meanwhile."""
        return tf.control_dependencies(after if recompute else [])

    @tf.custom_gradient
    def blocks(q, k, v):
        q32, k32 = f32(q), f32(k)
        q32_blocks = blocks_of(q32)
        kept, outputs = [], []  # kept: each block's weights in v's dtype, unless recomputed (kept_for_backward)
        for (start, end, first), q32_block in zip(spans, q32_blocks):
            with one_at_a_time(outputs[-1:]):
                weights = tf.cast(softmax(q32_block, k32, start, end, first), v.dtype)
                kept.append(None if recompute else weights)
                outputs.append(tf.matmul(weights, _rows(v, first, end)))

        def gradient(d_out):
            if recompute:
                # q and k cast again once the backward pass reaches this op, or grappler's deduplication merges the
                # casts with the forward pass's, whose fp32 copies of q and k (under bf16) are then kept till here
                with tf.control_dependencies([d_out]):
                    q32, k32 = f32(q), f32(k)
            d_q, d_k, d_v = [], [], []
            carry_k = carry_v = None  # over the keys from `carried_from` to the current block's start
            after = [d_out]
            # the query-length operands' blocks, each one Split (the keys' overlap: sliced, again, per block)
            d_out_blocks, q_blocks = blocks_of(d_out), blocks_of(q)
            q32_blocks = blocks_of(q32) if recompute else None
            for i in reversed(range(len(spans))):
                start, end, first = spans[i]
                with one_at_a_time(after):
                    keys, values = _rows(k, first, end), _rows(v, first, end)  # sliced again: not kept meanwhile
                    d_out_i = d_out_blocks[i]
                    d_weights = tf.matmul(d_out_i, values, transpose_b=True)
                    weights = softmax(q32_blocks[i], k32, start, end, first) if recompute else kept[i]
                    d_logits = compiled(_softmax_backward_as, weights, d_weights, q.dtype)
                    weights = tf.cast(weights, v.dtype)
                    d_q.append(tf.matmul(d_logits, keys))
                    part_k = f32(tf.matmul(d_logits, q_blocks[i], transpose_a=True))  # [.., end - first, key]
                    part_v = f32(tf.matmul(weights, d_out_i, transpose_a=True))
                if carry_k is not None:  # the carry covers [carried_from, start): pad its front to `first`
                    before = [[0, 0]] * (len(part_k.shape) - 2) + [[carried_from - first, 0], [0, 0]]
                    carry_k = part_k + tf.pad(carry_k, before) if carried_from > first else part_k + carry_k
                    carry_v = part_v + tf.pad(carry_v, before) if carried_from > first else part_v + carry_v
                else:
                    carry_k, carry_v = part_k, part_v
                rows = end - first
                d_k.append(tf.cast(_rows(carry_k, start - first, rows), k.dtype))
                d_v.append(tf.cast(_rows(carry_v, start - first, rows), v.dtype))
                carry_k, carry_v, carried_from = _rows(carry_k, 0, start - first), _rows(carry_v, 0, start - first), first
                after = [d_q[-1], d_k[-1], d_v[-1], carry_k, carry_v]  # the block done, nothing of it left pending
            return [tf.concat(d[::-1], axis=-2) for d in (d_q, d_k, d_v)]

        return tf.concat(outputs, axis=-2), gradient

    return blocks(q, k, v)


def causal_attention(q, k, v, length_dim, memory_length_dim, key_dim, value_dim, radius: int | None = None
                     ) -> mtf.Tensor:
    """Causal self-attention, global (query t sees keys 0..t) or local (`radius`: keys t - radius + 1..t; q over
    `length_dim`, k and v over `memory_length_dim`, the same positions), in blocks of queries
    (`causal_block_length`), each against only the keys its queries see: the masked half of the square above
    the diagonal is never computed (global, context 2048: 36 of 64 block pairs), nor the window's padding and
    far side (local). The same result as `attention` with the causal bias and as `local_attention_1d`
    (tests/models/kernels/). Forward and backward (written out, the softmax's fused) are batched matmuls on
    [..., length, features] slices. The caller makes sure that neither length is split over the mesh and that
    there is no dropout."""
    output_shape = q.shape - key_dim + value_dim
    shared = [d for d in q.shape.dims if d in k.shape.dims and d not in (key_dim, length_dim, memory_length_dim)]
    q = laid_out(q, shared + [length_dim, key_dim])  # in the activations' dtype: _causal_blocks casts the logits'
    k = laid_out(k, shared + [memory_length_dim, key_dim])  # operands to fp32 itself
    v = laid_out(v, shared + [memory_length_dim, value_dim])
    block_length = causal_block_length(length_dim.size, radius)
    recompute = length_dim.size > KEEPS_WEIGHTS_UP_TO
    out = mtf.slicewise(lambda q_, k_, v_: _causal_blocks(q_, k_, v_, block_length, radius, recompute), [q, k, v],
                        output_shape=mtf.Shape(shared + [length_dim, value_dim]), output_dtype=v.dtype,
                        splittable_dims=shared, name="causal_attention")
    # What the op keeps for its backward pass beyond its inputs and output, which the mtf graph does not show (the
    # memory plan, plan/dry_run.py, counts it with the activations the backward pass reads): every block's softmax
    # weights in v's dtype, or nothing where they are recomputed.
    pairs = sum(block_length * (start + block_length - _visible_keys(start, start + block_length, radius))
                for start in range(0, length_dim.size, block_length))
    out.operation.kept_for_backward = [] if recompute else [
        (mtf.Shape(shared + [mtf.Dimension("causal_attention_weights", pairs)]), v.dtype.size)]
    return laid_out(out, output_shape.dims)


def local_attention_1d(q, k, v, length_dim, key_dim, value_dim, radius: int, fully_autoregressive: bool = True,
                       attention_kwargs=None) -> mtf.Tensor:
    """mesh-tensorflow's `local_attention_1d` (one split of the length, no sequence ids or priorities): blocks
    of queries (local_attention_block_length above: the largest divisor of the length not above
    max(radius, 128)) attend to their block and the `radius` positions before it (and after it when not fully
    autoregressive), through `attention` above. Same blocks, halo exchange and visibility mask."""
    block_length = local_attention_block_length(length_dim.size, radius)
    query_block = mtf.Dimension("query_block_length", block_length)
    memory_block = mtf.Dimension("memory_block_length", block_length)
    num_blocks = mtf.Dimension(length_dim.name, length_dim.size // block_length)
    exchange = mtf.left_halo_exchange if fully_autoregressive else mtf.halo_exchange

    def as_query(x):
        return mtf.replace_dimensions(x, length_dim, [num_blocks, query_block])

    def as_memory(x):
        return exchange(mtf.replace_dimensions(x, length_dim, [num_blocks, memory_block]), num_blocks, memory_block,
                        radius)

    q, k, v = as_query(q), as_memory(k), as_memory(v)
    sequence_id = 1 + mtf.zeros(q.mesh, [length_dim], tf.int32)  # 0 in the halo's padding before the first block
    pos = mtf.range(q.mesh, length_dim, dtype=tf.int32)
    relative_position = as_memory(pos) - as_query(pos)
    visible = mtf.equal(as_query(sequence_id), as_memory(sequence_id))
    visible = mtf.logical_and(visible, mtf.greater(relative_position, -radius))
    visible = mtf.logical_and(visible, mtf.less_equal(relative_position, 0 if fully_autoregressive else radius))
    bias = mtf.cast(mtf.logical_not(visible), tf.float32) * -1e9  # float32 as the logits (-inf * 0 in float16)
    padded = mtf.Dimension("memory_block_length", (1 if fully_autoregressive else 2) * radius + block_length)
    o = attention(q, k, v, padded, key_dim, value_dim, bias, **(attention_kwargs or {}))
    return mtf.replace_dimensions(o, [num_blocks, query_block], length_dim)
