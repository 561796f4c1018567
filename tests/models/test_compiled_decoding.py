"""Compiled decoding (models/compiled_decoding.py): the same tokens as the mtf sampler's loop in float32, logits
within bf16's rounding of an fp32 full recompute in bfloat16, and the mtf loop wherever it does not apply."""
import os

import numpy as np
import pytest

from models import compiled_decoding
from models.sampling import SamplingOptions
from models.kernels.common import kernels
from infer.run import Predictor
from tests.models.kernels.test_native import compiler_found
from tiny import placement_for, random_tokens, tiny_config

MAX_NEW = 6
# The native products need a C++ compiler to be built (models/kernels/native.py); without one, XLA's are the path
COMPILER = compiler_found()
SAMPLED = dict(temperature=1.0, top_k=20, top_p=0.9)


@pytest.fixture(scope="module")
def cfg():
    # Local window 4 < the positions sampled, so the step's window (a slice of the cache) is exercised.
    return tiny_config(local_attention_radius=4)


@pytest.fixture(scope="module")
def rows(cfg):
    """Prompts of different lengths in one batch (row 4 fills the context, row 2 is longer than a bucket of 4),
    each row its own seed."""
    lengths = np.array((3, 5, 9, 3, cfg.n_ctx, 2), np.int32)
    tokens = random_tokens([len(lengths), cfg.n_ctx], vocab=cfg.n_vocab, seed=1)
    tokens[np.arange(cfg.n_ctx)[None, :] >= lengths[:, None]] = 0
    return {"tokens": tokens, "prompt_length": lengths, "seed": np.arange(7, 7 + len(lengths), dtype=np.int32)}


@pytest.fixture(scope="module")
def predictor(cfg):
    with Predictor(cfg, placement_for(cfg)) as kept:
        yield kept


def both(cfg, predictor, rows, **options):
    """(mtf loop's outputs, compiled outputs) for these sampling options."""
    out = []
    for compiled in (False, True):
        opts = SamplingOptions.from_config(cfg, max_new_tokens=MAX_NEW, padding_id=0, compiled=compiled, **options)
        out.append(predictor.predict(rows, len(rows["tokens"]), opts))
    return out


# greedy stays in the fast tier (it fails with the window's off-by-one, docs/testing.md); the rest run in CI
@pytest.mark.parametrize("options", [
    pytest.param(dict(temperature=0.0), id="greedy"),
    pytest.param(SAMPLED, id="sampled", marks=pytest.mark.slow),
    pytest.param(dict(temperature=0.0, prefill_length=4), id="bucket-4", marks=pytest.mark.slow),
    pytest.param(dict(SAMPLED, stop_id=None, stop_ids=(3, 11, 17, 29, 40, 51, 60), remove_partial_sequences=True),
                 id="stops-remove-partial", marks=pytest.mark.slow)])
def test_compiled_tokens_are_the_mtf_loops(cfg, predictor, rows, options):
    assert compiled_decoding.unsupported(cfg, SamplingOptions.from_config(cfg)) is None
    mtf_loop, compiled = both(cfg, predictor, rows, **options)
    np.testing.assert_array_equal(compiled["tokens"], mtf_loop["tokens"])
    np.testing.assert_array_equal(compiled["lengths"], mtf_loop["lengths"])
    if "stop_ids" in options:  # some row stopped early at one of the ids, so the stops were exercised
        assert (mtf_loop["lengths"] < MAX_NEW).any()
    # on these CPU devices the compiled program's steps call the native products (models/kernels/native.py)
    graph = predictor._shared[0]
    called = any(node.op == "XlaCustomCallV2" for f in graph.as_graph_def().library.function for node in f.node_def)
    assert called == COMPILER


# ----------------------------------------------------------------------------------------------------------
# The compiled step's logits against an fp32 full recompute written in NumPy (an oracle of its own)


def random_weights(cfg, seed=0) -> dict:
    """{variable name: float32 array} at scales where every part of the model moves the logits."""
    from models import gpt
    rng = np.random.RandomState(seed)
    weights = {}
    for name, shape in sorted(gpt.variable_shapes(cfg).items()):
        if name.endswith("/g"):
            weights[name] = 1.0 + 0.1 * rng.randn(*shape)
        elif name.endswith(("/b", "bias", "o_b")):
            weights[name] = 0.1 * rng.randn(*shape)
        elif name.endswith(("wte", "wpe")):
            weights[name] = 0.3 * rng.randn(*shape)
        else:
            weights[name] = rng.randn(*shape) / np.sqrt(shape[0])
    return {name: value.astype(np.float32) for name, value in weights.items()}


def numpy_logits(cfg, w, tokens) -> np.ndarray:
    """GPT-Neo's forward over one row of tokens [length] in float64 -> logits [length, vocab]."""
    w = {name: value.astype(np.float64) for name, value in w.items()}

    def norm(x, scope):
        x = x - x.mean(-1, keepdims=True)
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * w[scope + "/g"] + w[scope + "/b"]

    length, heads, size = len(tokens), cfg.n_head, cfg.head_size
    x = w["gpt2/wte"][tokens] + w["gpt2/wpe"][:length]
    query, memory = np.arange(length)[:, None], np.arange(length)[None, :]
    for i in range(cfg.n_layer):
        p = f"gpt2/h{i}/"
        h = norm(x, p + "norm_1")
        q, k, v = (np.reshape(h @ w[p + "attn/" + n], [length, heads, size]).transpose(1, 0, 2) for n in "qkv")
        hidden = memory > query
        if cfg.attention_types[i] == "local":
            hidden |= memory <= query - cfg.local_attention_radius
        logits = np.where(hidden, -np.inf, q @ k.transpose(0, 2, 1))   # unscaled, as GPT-Neo
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        a = (weights / weights.sum(-1, keepdims=True)) @ v
        x = x + a.transpose(1, 0, 2).reshape(length, -1) @ w[p + "attn/o"] + w[p + "attn/compute_output_bias/o_b"]
        h = norm(x, p + "norm_2") @ w[p + "mlp/conv1d_main/c_fc/kernel"] + w[p + "mlp/conv1d_main/c_fc/bias"]
        h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
        x = x + h @ w[p + "mlp/conv1d_main/c_proj/kernel"] + w[p + "mlp/conv1d_main/c_proj/bias"]
    if cfg.no_weight_tie:
        out = "gpt2/wte_final_linear/conv1d_main/linear_out/"
        return norm(x, "gpt2/ln_f") @ w[out + "kernel"] + w[out + "bias"]
    return norm(x, "gpt2/ln_f") @ w["gpt2/wte"].T


def compiled_step_logits(cfg, weights, tokens, span, dtype, native_products=False):
    """The compiled path's logits for positions span + 1 .. len(tokens) of one row (a prefill over `span`, then
    one step per position in a loop, as `generate` runs them), the weights in `dtype` -> [len(tokens) - span,
    vocab]; `native_products`: the steps' products are models/kernels/native.py's (asserted: the program calls
    them)."""
    import tensorflow.compat.v1 as tf
    names = sorted(weights)
    steps = cfg.n_ctx - span

    @tf.function(jit_compile=True, autograph=False)
    def run(row, *values):
        model = compiled_decoding._Model(cfg, {n: tf.cast(v, dtype) for n, v in zip(names, values)}, native_products)
        caches = compiled_decoding._prefill(model, row, span, cfg.n_ctx)

        def body(position, out, *caches):
            logits, caches = compiled_decoding._step(model, row[:, position - 1], position, list(caches))
            return [position + 1, tf.tensor_scatter_nd_update(out, [[position - span - 1]], logits)] + caches

        out = tf.zeros([steps, cfg.n_vocab])
        return tf.while_loop(lambda position, *_: position <= cfg.n_ctx, body,
                             [tf.constant(span + 1), out] + caches)[1]

    row = np.zeros([1, cfg.n_ctx], np.int32)
    row[0, :len(tokens)] = tokens
    with tf.Graph().as_default(), tf.Session() as session:
        args = [tf.placeholder(tf.int32, row.shape)] + [tf.placeholder(tf.float32, weights[n].shape) for n in names]
        program = run.get_concrete_function(*args).graph.as_graph_def()
        custom_calls = [node for node in [*program.node, *(n for f in program.library.function for n in f.node_def)]
                        if node.op == "XlaCustomCallV2"]
        # the step's (each layer's qkv, o, fc and proj, and the logits) once in the loop's body; none in the prefill
        # (a stored program with custom calls outside the loop crashed when loaded from XLA's persistent cache)
        assert len(custom_calls) == (4 * cfg.n_layer + 1) * native_products
        # the weights as stored (bf16: half the bytes)
        assert all(node.attr["operand_dtypes"].list.type[1] == dtype.as_datatype_enum for node in custom_calls)
        logits = session.run(run(*args), dict(zip(args, [row] + [weights[n] for n in names])))
        return logits[:len(tokens) - span]


# XLA's products (the path without a compiler) in the slow tier: the fast one keeps the default, native
@pytest.mark.parametrize("products", ["native", pytest.param("xla", marks=pytest.mark.slow)])
@pytest.mark.parametrize("no_weight_tie,prefixes", [  # the prefixes' case fails fast with a short prefix
    pytest.param(False, (4, 8), id="tied-prefixes-4-8"),
    pytest.param(True, None, id="untied-whole-cache", marks=pytest.mark.slow)])
def test_compiled_step_logits_are_an_fp32_full_recomputes_in_float32_and_within_bf16_rounding_in_bfloat16(
        no_weight_tie, prefixes, products, monkeypatch):
    """Positions past the local window (4) and a prefill shorter than the row, so the window's slice of the
    cache, the global layer's masked read (of the whole cache, or of prefixes of 4 and 8 rows as the steps pass
    them: the bench model's 256, 512 and 1024 scaled to n_ctx 16) and the steps' cache writes all decide logits.
    bf16: the weights handed over in bf16 (the native products read them as bf16, XLA's widened once; computed in
    fp32); the error bound is the oracle's own sensitivity (its logits moved by rounding the weights to bf16)
    times 4."""
    import tensorflow.compat.v1 as tf
    from models.kernels import native
    native_products = products == "native"
    if native_products:
        if not COMPILER:
            pytest.skip("no C++ compiler here: the native products cannot be built")
        assert native.library() is not None, native.why_not()
    if prefixes:
        monkeypatch.setattr(compiled_decoding, "PREFIXES", prefixes)
    cfg = tiny_config(local_attention_radius=4, no_weight_tie=no_weight_tie)
    weights = random_weights(cfg)
    tokens = random_tokens([12], vocab=cfg.n_vocab, seed=3)
    span = 3
    want = numpy_logits(cfg, weights, tokens)[span:]
    fp32 = compiled_step_logits(cfg, weights, tokens, span, tf.float32, native_products)
    np.testing.assert_allclose(fp32, want, rtol=0, atol=1e-4 * np.abs(want).max())
    rounded = {n: tf.bfloat16.as_numpy_dtype(v).astype(np.float32) for n, v in weights.items()}
    sensitivity = np.abs(numpy_logits(cfg, rounded, tokens)[span:] - want).max()
    assert sensitivity > 1e-3 * np.abs(want).max()  # the bf16 rounding matters at these scales
    bf16 = compiled_step_logits(cfg, weights, tokens, span, tf.bfloat16, native_products)
    error = np.abs(bf16 - want).max()
    assert error < 4 * sensitivity, (error, sensitivity)
    assert (bf16.argmax(-1) == want.argmax(-1)).mean() >= 0.75


def built_ops(cfg, options) -> list:
    """The mtf operations' names of cfg's sampling graph (built, not run)."""
    import mesh_tensorflow as mtf
    import tensorflow.compat.v1 as tf
    from infer import outputs
    from models import gpt
    from tiny import cpu_mesh_impl
    with tf.Graph().as_default():
        mesh = mtf.Mesh(mtf.Graph(), "mesh")
        features = {"tokens": tf.zeros([2, cfg.n_ctx], tf.int32), "prompt_length": tf.ones([2], tf.int32)}
        outputs.predict_outputs(features, mesh, cfg, gpt.Dims.of(cfg, 2), options)
        return [op.name for op in mesh.graph.operations]


@pytest.mark.parametrize("change,why", [
    (dict(compiled_decoding=False), "compiled_decoding is false"),
    (dict(kv_cache=False), "full recompute"),
    (dict(mesh_shape="x:2", layout="batch:x"), "more than one device"),
    (dict(activation_function="relu"), "activation_function 'relu'"),
    (dict(scalenorm=True), "option scalenorm"),
    (dict(attention_types=[[["global", "none"], 1]]), "attention type 'none'"),
    (dict(precision="float16"), "precision 'float16'")])
def test_what_the_compiled_path_does_not_compute_falls_back_to_the_mtf_loop(change, why):
    cfg = tiny_config(**change)
    options = SamplingOptions.from_config(cfg, max_new_tokens=2)
    assert why in compiled_decoding.unsupported(cfg, options)
    ops = built_ops(cfg, options)
    assert not any(name.startswith("compiled_sample") for name in ops) and any("while_loop" in n for n in ops)


def test_supported_models_build_the_compiled_program_and_plain_kernels_keep_the_mtf_loop():
    cfg = tiny_config(no_weight_tie=True, precision="bfloat16")
    options = SamplingOptions.from_config(cfg, max_new_tokens=2)
    assert any(name.startswith("compiled_sample") for name in built_ops(cfg, options))
    with kernels("plain"):  # devices where XLA cannot compile (XLA:GPU without ptxas)
        assert "plain" in compiled_decoding.unsupported(cfg, options)
        assert not any(name.startswith("compiled_sample") for name in built_ops(cfg, options))


# ----------------------------------------------------------------------------------------------------------
# A program loaded from XLA's persistent compile cache (what every process after the first runs)

LOADED_THREE_TIMES = """
import sys
sys.path.insert(0, "tests")
import conftest  # the CPU's devices, as in the suite
import os

import numpy as np
from infer.run import Predictor
from models.sampling import SamplingOptions
from tiny import placement_for, random_tokens, tiny_config
cfg = tiny_config(precision="bfloat16")
rows = {"tokens": random_tokens([1, cfg.n_ctx], vocab=cfg.n_vocab, seed=1), "prompt_length": np.array([5], np.int32),
        "seed": np.array([7], np.int32)}
options = SamplingOptions.from_config(cfg, max_new_tokens=6, padding_id=0, compiled=True, temperature=0.0,
                                      prefill_length=8)
for run in range(3):
    with Predictor(cfg, placement_for(cfg)) as predictor:  # a graph and session each: the cache is per session
        print("tokens", predictor.predict(rows, 1, options)["tokens"][0].tolist(), flush=True)
"""


@pytest.mark.slow  # a fresh process (~11 s)
@pytest.mark.skipif(not COMPILER, reason="no C++ compiler here: the native products cannot be built")
def test_a_native_program_loaded_from_xlas_compile_cache_samples_the_tokens_it_sampled_when_compiled(
        tmp_path, monkeypatch):
    """Three Predictors on one cache folder, in a process of their own: the first traces the program, stores its
    trace and compiles it as read back; the second and third load that executable from disk, as every later
    process does. The prefill's 8 rows are few enough for the native products: made native custom calls there
    (outside the loop), the loaded program crashed in its first one (SIGSEGV, TF 2.21's XLA:CPU), which is why
    the prefill keeps XLA's products (models/compiled_decoding.py, `_prefill`). Bugs caught: the prefill's
    products native; the first process compiling the traced names' program (no later process asks for it: the
    second compiled the stored names' again, two executables)."""
    from workspace import run_python
    monkeypatch.setenv("TF_XLA_FLAGS", f"--tf_xla_persistent_cache_directory={tmp_path}")
    done = run_python(LOADED_THREE_TIMES, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr[-3000:]}"
    runs = [line for line in done.stdout.splitlines() if line.startswith("tokens")]
    assert len(runs) == 3 and len(set(runs)) == 1, runs
    executables = [name for name in os.listdir(tmp_path) if name.startswith("xla_compile_cache")]
    assert len(executables) == 1, executables  # compiled once; the later runs loaded it
