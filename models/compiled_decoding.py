"""A whole generation as one XLA program: the prefill over the prompts' bucket and the token loop inside one
`tf.function(jit_compile=True)`, for the models and layouts it supports; models/sampling.py's `sample` runs it
where `unsupported` says None, and its mtf loop otherwise.

The mtf sampler's loop body is some 545 small TF ops a token (LayerNorm and GELU unfused at batch 1, reshapes
around every matrix-vector product, the cache writes), launched one by one: 9-12 ms a token on the bench model,
where reading its weights takes 3.6-4.2. Here XLA compiles the prefill, the loop (an XLA While, the caches its
state, written in place by dynamic-update-slice) and the token choice (models/token_choice.py: the same
stateless draw, so the same tokens for a seed) into one program, launched once per generation.

It reads the weights as the mesh's variables hand them to the model (fp32, or bf16 under `precision: bfloat16`,
cast once per generation), so it needs every weight whole on one device: one-device meshes. It computes in
fp32 in either precision (the values bf16 gives, each product and sum in fp32). On a CPU the step's
matrix-vector products are models/kernels/native.py's custom calls, which read the weights as stored (bf16:
half the bytes) on every core; the prefill's products, and the step's where the native library is unavailable,
are XLA's over weights widened once per generation (XLA:CPU's own bf16 matrix-vector products were slower than
fp32 ones on a 2-core AVX-512-bf16 EPYC: 12.0 against 9.4 CPU ms a token on the bench model, 2026-12-04). Supported: GPT-Neo's
own model (global and local attention, LayerNorm, GELU MLP, learned positions, tied or untied output), in
float32 or bfloat16, with every sampling option (temperature, top-k, top-p, entmax, stop ids, per-row prompt
lengths, remove_partial_sequences). `compiled_decoding: false` (or `--no_compiled_decoding`) keeps the mtf loop.

The arithmetic is the mtf step's: LayerNorm over fp32, GELU's tanh form, attention logits and softmax in fp32
over the cache with the step's visibility mask (local layers read only their window; global layers the
smallest of PREFIXES holding the rows before the query, or the whole cache: an XLA conditional over static
shapes), so in float32 the tokens are the mtf sampler's (tested, greedy and sampled). In bfloat16 the
logits are those of the bf16-rounded weights in fp32 arithmetic (tested against a NumPy fp32 forward).
"""
from __future__ import annotations

import copy
import dataclasses
import math
from typing import Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf
from tensorflow.compiler.tf2xla.python import xla

from models.attention import uses_cache
from models.kernels import native, traces
from models.kernels.common import MASKED, widened, xla_kernels
from models.kernels.elementwise import _GELU_C
from models.token_choice import NO_STOP, choose_tokens_tf, is_one_of_tf
from schema import GPTConfig

PREFIXES = (256, 512, 1024)  # the cache prefixes a global layer's step reads (and the whole cache)
_OPTIONS = {"no_weight_tie"}  # model options the compiled path computes (the rest fall back to the mtf loop)
_PRECISIONS = {"float32", "bfloat16", "auto"}  # "auto" reaching a model unresolved builds in float32
# Config fields no program reads (where a run's files are, what it logs, how long it trains and evaluates): left
# out of what the stored trace is keyed by, so the runs of one model in other folders (a ladder's, a benchmark's
# temporary ones) read one trace
_RUN_FIELDS = {"model_path", "datasets", "eval_results_path", "lambada_path", "harness_include_path", "wandb_project",
               "wandb_mode", "train_steps", "steps_per_checkpoint", "keep_checkpoint_max",
               "keep_checkpoint_every_n_hours", "keep_checkpoint_steps", "eval_steps", "predict_steps", "eval_tasks",
               "harness_tasks", "harness_limit", "harness_num_fewshot"}


def unsupported(cfg: GPTConfig, options) -> Optional[str]:
    """None if a generation of `cfg` with sampling `options` runs compiled, else why not (then models/sampling.py
    runs its mtf loop)."""
    if not options.compiled:
        return "compiled_decoding is false"
    if not uses_cache(cfg, options):
        return "the model decodes by full recompute"
    if math.prod(size for _, size in cfg.mesh_dims) != 1:
        return f"mesh_shape {cfg.mesh_shape!r} has more than one device"
    kinds = sorted(set(cfg.attention_types) - {"global", "local"})
    if kinds:
        return f"attention type {kinds[0]!r}"
    extra = [o for o in cfg.model_options() if o.split("=")[0] not in _OPTIONS]
    if extra:
        return f"option {extra[0]}"
    if cfg.activation_function != "gelu":
        return f"activation_function {cfg.activation_function!r}"
    if cfg.precision not in _PRECISIONS:
        return f"precision {cfg.precision!r}"
    if not cfg.causal:
        return "a bidirectional model"
    if not xla_kernels():
        return "the kernels run as plain TF ops (no XLA on these devices)"
    return None


def _layer_norm(x, g, b, epsilon=1e-5):
    """models/kernels/elementwise.py's LayerNorm formula, fp32 in and out."""
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    xc = x - mean
    r = tf.math.rsqrt(tf.reduce_mean(xc * xc, axis=-1, keepdims=True) + epsilon)
    return xc * r * g + b


def _gelu(y):
    return y * (0.5 * (1.0 + tf.tanh(_GELU_C * (y + 0.044715 * y * y * y))))


@dataclasses.dataclass(frozen=True)
class _Matrix:
    """A weight matrix as stored (fp32 or bf16: the native products read it) and widened to fp32 (XLA's products
    read it; XLA drops the widening where none does). Both are made where the model is, outside the token loop:
    widened inside it, every token would widen the weights again (XLA keeps size-growing ops in the loop)."""
    stored: tf.Tensor
    wide: tf.Tensor

    @classmethod
    def of(cls, stored):
        return cls(stored, widened(stored))


def _dense(x, kernel: _Matrix, bias=None, native_products: bool = False, transposed: bool = False):
    """x [..., in] @ kernel [in, out] (or kernel [out, in] transposed) (+ bias), fp32. A few rows (a decoding
    step's) with `native_products` are the native library's product over the stored weights, more rows XLA's."""
    x2 = tf.reshape(x, [-1, x.shape[-1]])
    rows = x2.shape[0]
    if native_products and rows is not None and rows <= native.MAX_ROWS:
        y = native.product(x2, kernel.stored, transposed)
    else:
        y = tf.matmul(x2, kernel.wide, transpose_b=transposed)
    out = kernel.stored.shape[0] if transposed else kernel.stored.shape[1]
    y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [out]], 0))
    return y if bias is None else y + bias


class _Model:
    """The weights by role from {variable name: tensor} (fp32, or bf16 under `precision: bfloat16`): matrices as
    `_Matrix`, vectors widened to fp32 (see the module docstring). `native_products`: the step's matrix-vector
    products are models/kernels/native.py's."""

    def __init__(self, cfg: GPTConfig, weights: dict, native_products: bool = False):
        self.cfg = cfg
        self.native = native_products
        w = lambda name: widened(weights["gpt2/" + name])  # noqa: E731
        m = lambda name: _Matrix.of(weights["gpt2/" + name])  # noqa: E731
        self.wte, self.wpe = m("wte"), m("wpe")
        self.layers = []
        for i in range(cfg.n_layer):
            p = f"h{i}/"
            self.layers.append(dict(
                kind=cfg.attention_types[i],
                ln1=(w(p + "norm_1/g"), w(p + "norm_1/b")), ln2=(w(p + "norm_2/g"), w(p + "norm_2/b")),
                # q, k and v side by side: one product a token (stacked once per generation)
                qkv=_Matrix.of(tf.concat([weights[f"gpt2/{p}attn/{n}"] for n in "qkv"], axis=1)),
                o=m(p + "attn/o"), o_b=w(p + "attn/compute_output_bias/o_b"),
                fc=(m(p + "mlp/conv1d_main/c_fc/kernel"), w(p + "mlp/conv1d_main/c_fc/bias")),
                proj=(m(p + "mlp/conv1d_main/c_proj/kernel"), w(p + "mlp/conv1d_main/c_proj/bias"))))
        self.ln_f = (w("ln_f/g"), w("ln_f/b"))
        if cfg.no_weight_tie:
            self.out = (m("wte_final_linear/conv1d_main/linear_out/kernel"),
                        w("wte_final_linear/conv1d_main/linear_out/bias"))
        else:
            self.out = None

    def window(self, kind: str) -> Optional[int]:
        return self.cfg.local_attention_radius if kind == "local" else None

    def dense(self, x, kernel: _Matrix, bias=None, transposed: bool = False):
        return _dense(x, kernel, bias, self.native, transposed)

    def embed(self, tokens, positions):
        """The token and position embeddings' rows, fp32 (only the rows read are widened)."""
        return widened(tf.gather(self.wte.stored, tokens)) + widened(tf.gather(self.wpe.stored, positions))

    def logits(self, h):
        """h [..., embd] fp32 -> logits [..., vocab] fp32."""
        h = _layer_norm(h, *self.ln_f)
        if self.out is not None:
            return self.dense(h, *self.out)
        return self.dense(h, self.wte, transposed=True)

    def mlp(self, x, layer):
        return self.dense(_gelu(self.dense(_layer_norm(x, *layer["ln2"]), *layer["fc"])), *layer["proj"])

    def qkv(self, x, layer):
        """x [..., embd] -> q, k, v [..., heads, kv] fp32."""
        y = self.dense(_layer_norm(x, *layer["ln1"]), layer["qkv"])
        y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [3, self.cfg.n_head, self.cfg.head_size]], 0))
        return tf.unstack(y, axis=-3)


def _attend(q, k, v, bias):
    """q [..., kv], k and v [..., memory, kv], bias [memory] or [queries, memory] -> [..., kv], fp32 logits and
    softmax (the mtf step's formula)."""
    logits = tf.matmul(q, k, transpose_b=True) + bias
    return tf.matmul(tf.nn.softmax(logits, axis=-1), v)


def _prefill(model: _Model, tokens, span: int, length: int):
    """Every layer's keys and values over the first `span` positions of tokens [batch, >= span], as caches
    [batch * heads, length, kv] (zeros after `span`). Three axes, none of size 1: with [batch, heads, ...] at batch 1,
    XLA fused each step's cache write twice (once bitcast to [heads, ...] for the attention's product, once for
    the loop's state), each into a buffer of its own, and copied every global layer's cache twice a token (48 of
    the bench model's ~90 MB a token)."""
    cfg = model.cfg
    # XLA's products over the prefill's rows, never the native ones: XLA:CPU's persistent compile cache stored a
    # program with custom calls outside its While that crashed when a later process loaded it (TF 2.21: the
    # default model's `--predict` with the XLA kernels, heap corruption in the first custom call); the loop's
    # calls load fine, and a prefill's product is a matrix product, not the weights' reads the kernel is for
    model = copy.copy(model)
    model.native = False
    x = model.embed(tokens[:, :span], tf.range(span)[None])
    query = tf.range(span)[:, None]
    memory = tf.range(span)[None, :]
    caches = []
    for layer in model.layers:
        q, k, v = (tf.transpose(t, [0, 2, 1, 3]) for t in model.qkv(x, layer))     # [batch, heads, span, kv]
        hidden = memory > query
        window = model.window(layer["kind"])
        if window is not None:
            hidden = tf.logical_or(hidden, memory <= query - window)
        bias = tf.cast(hidden, tf.float32) * MASKED
        a = tf.transpose(_attend(q, k, v, bias), [0, 2, 1, 3])                      # [batch, span, heads, kv]
        a = tf.reshape(a, tf.concat([tf.shape(a)[:2], [cfg.n_embd]], 0))
        x = x + model.dense(a, layer["o"], layer["o_b"])
        x = x + model.mlp(x, layer)
        pad = [[0, 0], [0, length - span], [0, 0]]
        caches += [tf.pad(tf.reshape(t, [-1, span, cfg.head_size]), pad) for t in (k, v)]
    return caches


def _step(model: _Model, token, position, caches):
    """token [batch] at position - 1 -> logits [batch, vocab] for `position`, and the caches with this token's
    keys and values written at position - 1.

    The attention reads the caches as they came in (every row before position - 1 it may see) and this token's
    key and value beside them, and only then are they written: a write read by anything but the loop's state
    was fused by XLA into each of its readers, each copy in a buffer of its own, which copied every cache twice
    a token (48 of the bench model's ~90 MB a token)."""
    cfg = model.cfg
    query = position - 1
    x = model.embed(token, query[None])
    new_caches = []
    for i, layer in enumerate(model.layers):
        q, k, v = (tf.reshape(t, [-1, 1, cfg.head_size]) for t in model.qkv(x, layer))  # [batch * heads, 1, kv]
        k_cache, v_cache = caches[2 * i], caches[2 * i + 1]
        rows, length, kv = k_cache.shape.as_list()
        window = model.window(layer["kind"])
        if window is not None and window < length:  # only the window's rows
            start = tf.clip_by_value(query - window + 1, 0, length - window)
            k_rows = xla.dynamic_slice(k_cache, [0, start, 0], [rows, window, kv])
            v_rows = xla.dynamic_slice(v_cache, [0, start, 0], [rows, window, kv])
            memory = start + tf.range(window)
        else:
            k_rows, v_rows, memory = k_cache, v_cache, tf.range(length)

        def attend(k_rows, v_rows, memory):
            hidden = memory >= query  # this position's own key and value come from k and v
            if window is not None:
                hidden = tf.logical_or(hidden, memory <= query - window)
            bias = tf.cast(hidden, tf.float32) * MASKED
            logits = tf.concat([tf.matmul(q, k_rows, transpose_b=True) + bias,
                                tf.reduce_sum(q * k, axis=-1, keepdims=True)], axis=-1)  # [batch * heads, 1, seen + 1]
            weights = tf.nn.softmax(logits, axis=-1)
            return tf.matmul(weights[..., :-1], v_rows) + weights[..., -1:] * v

        prefixes = [size for size in PREFIXES if size < length]
        if window is None and prefixes:  # a global layer reads the rows before the query, in a prefix of fixed size
            sizes = prefixes + [length]
            branch = tf.reduce_sum(tf.cast(query > tf.constant(prefixes), tf.int32))  # rows 0 .. query - 1
            a = tf.switch_case(branch, [lambda n=n: attend(k_cache[:, :n], v_cache[:, :n], tf.range(n)) for n in sizes])
        else:
            a = attend(k_rows, v_rows, memory)
        x = x + model.dense(tf.reshape(a, [-1, cfg.n_embd]), layer["o"], layer["o_b"])
        x = x + model.mlp(x, layer)
        # query itself, computed from the attention's output: the writes then depend on the reads, so XLA orders
        # them after and writes in place (reads and writes unordered, it copied each cache twice a token)
        read = tf.cast(tf.reduce_any(tf.math.is_nan(a)), tf.int32)
        at = [0, tf.minimum(query, query + read), 0]
        new_caches += [xla.dynamic_update_slice(k_cache, k, at), xla.dynamic_update_slice(v_cache, v, at)]
    return model.logits(x), new_caches


def generate(cfg: GPTConfig, options, span: int, names: list, tokens, prompt_lengths, seeds, temperature, top_k,
             top_p, max_new_tokens, stop_id, rows, *weights, native_products: bool = False):
    """models/sampling.sample's loop on TF tensors: tokens [batch, length] int32, prompt_lengths and seeds [batch]
    int32, the drawn options [batch] each (models/sampling.DRAWN), the rows' ids in the draw's noise [batch]
    (models/sampling.Draw.row), the weights in the order of `names` ->
    (tokens, lengths) as `sample` returns them. The prefill runs over the first `span` positions;
    `native_products`: the step's products are the native library's."""
    model = _Model(cfg, dict(zip(names, weights)), native_products)
    batch, length = tokens.shape.as_list()
    caches = _prefill(model, tokens, span, length)
    start = tf.reduce_min(prompt_lengths)
    if span < length:
        start = tf.minimum(start, span + 1)
    limit = tf.minimum(prompt_lengths + max_new_tokens, length)
    end = tf.reduce_max(limit)
    done = tf.cast(prompt_lengths >= limit, tf.int32)

    def cond(position, tokens_, done_, lengths_, *caches_):
        return tf.logical_and(position < end, tf.reduce_min(done_) < 1)

    def body(position, tokens_, done_, lengths_, *caches_):
        step_logits, new_caches = _step(model, tokens_[:, position - 1], position, list(caches_))
        new = choose_tokens_tf(step_logits, seeds, rows, position, options, temperature, top_k, top_p)
        in_prompt = position < prompt_lengths
        active = tf.logical_and(tf.logical_not(in_prompt), tf.equal(done_, 0))
        value = tf.where(in_prompt, tokens_[:, position], tf.where(active, new, tf.fill([batch], options.padding_id)))
        tokens_ = xla.dynamic_update_slice(tokens_, value[:, None], [0, position])
        lengths_ = tf.where(active, tf.fill([batch], position + 1), lengths_)
        finished = position + 1 >= limit
        if options.stop_id != NO_STOP:  # not a program for rows that never stop
            finished = tf.logical_or(finished, tf.equal(new, stop_id))
        if options.stop_ids:
            finished = tf.logical_or(finished, is_one_of_tf(new, options.stop_ids))
        done_ = tf.maximum(done_, tf.cast(tf.logical_and(active, finished), tf.int32))
        return [position + 1, tokens_, done_, lengths_] + new_caches

    outputs = tf.while_loop(cond, body, [start, tokens, done, prompt_lengths] + caches)
    tokens, lengths = outputs[1], outputs[3]
    if options.remove_partial_sequences:  # each row shifted left by its prompt, zeros after
        index = tf.range(length)[None, :] + prompt_lengths[:, None]
        tokens = tf.where(index < length, tf.gather(tokens, tf.minimum(index, length - 1), batch_dims=1),
                          tf.zeros_like(tokens))
        lengths = lengths - prompt_lengths
    filled = tf.range(length)[None, :] < lengths[:, None]
    return tf.where(filled, tokens, tf.fill(tf.shape(tokens), options.padding_id)), lengths


class CompiledSampleOperation(mtf.Operation):
    """`generate` as one XLA program on the mesh's one device: inputs tokens, prompt_lengths, seeds, the drawn
    options and the model's weights (the variables' tensors in the activations' dtype), outputs tokens and
    lengths."""

    def __init__(self, cfg, options, span, tokens, prompt_lengths, seeds, drawn: list, variables: list):
        super().__init__([tokens, prompt_lengths, seeds] + drawn + [v.outputs[0] for v in variables],
                         name="compiled_sample")
        self._cfg, self._options, self._span = cfg, options, span
        self._names = [v.name for v in variables]
        self._outputs = [mtf.Tensor(self, tokens.shape, tf.int32), mtf.Tensor(self, prompt_lengths.shape, tf.int32)]

    def lower(self, lowering):
        mesh_impl = lowering.mesh_impl(self)
        if mesh_impl.size != 1:
            raise ValueError(f"compiled decoding runs on one device, not a mesh of {mesh_impl.size}")
        cfg, options, span, names = self._cfg, self._options, self._span, self._names
        # The native products are custom calls this process registered for the host: only on named CPU devices
        # (the export's device "" makes a SavedModel that loads anywhere, with no library: XLA's products)
        devices = getattr(mesh_impl, "devices", None) or []
        on_cpu = bool(devices) and all("CPU" in d.upper() for d in devices)
        native_products = on_cpu and native.library() is not None

        def program():
            return tf.function(lambda *a: generate(cfg, options, span, names, *a, native_products=native_products),
                               jit_compile=True, autograph=False)

        def run(*args):  # traced once per machine (models/kernels/traces.py): what the trace is made from
            model = tuple((f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.name not in _RUN_FIELDS)
            made_from = (model, options, span, names, native_products, PREFIXES, native.MAX_ROWS)
            return tuple(traces.call(program, args, made_from))

        outputs = mesh_impl.slicewise(run, *(lowering.tensors[t] for t in self.inputs))
        for output, value in zip(self.outputs, outputs):
            lowering.set_tensor_lowering(output, value)


def sample(tokens: mtf.Tensor, prompt_lengths: mtf.Tensor, seeds: mtf.Tensor, cfg: GPTConfig, dims, options, draw,
           span: int) -> dict:
    """models/sampling.sample's outputs, compiled. The model's variables are made as the mtf sampler makes them
    (its forward over the prefill's span, never run: a graph's variables are made by the model's own code)."""
    from models import gpt
    gpt.logits(mtf.slice(tokens, 0, span, dims.sequence.name), cfg,
               dataclasses.replace(dims, sequence=mtf.Dimension(dims.sequence.name, span)), train=False)
    variables = [v for v in tokens.mesh.graph.all_variables if v.name.startswith("gpt2/")]
    drawn = [draw.temperature, draw.top_k, draw.top_p, draw.max_new_tokens, draw.stop_id, draw.row]
    op = CompiledSampleOperation(cfg, options, span, tokens, prompt_lengths, seeds, drawn, variables)
    return {"tokens": op.outputs[0], "lengths": op.outputs[1]}
