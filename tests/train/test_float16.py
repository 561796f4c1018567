"""precision "float16": float16 activations with float32 master weights and dynamic loss scaling
(train/loss_scale.py), for GPUs without bfloat16; its numerics checked on CPU as bfloat16's are."""
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from schema import ConfigError
from conftest import CPU_DEVICES
from config import replace
from models import layers
from models.activations import activation_for
from models.attention import ATTENTION, AttentionContext
from models.kernels import attention, elementwise
from models.sampling import SamplingOptions
from modelpath import checkpoints
from execution import meshes
from execution.mesh_session import MeshSession
from tiny import (compute_logits, devices_for, fixed_batches, placement_for, random_tokens, run_predict,
                  tiny_config)
from tools import hf
from execution.callbacks import EachStep
from train import divergence, loop, loss_scale
from train.step import training_step

PATTERN = (np.arange(2 * 4 * 17).reshape(2, 4, 17) % 7 + 1).astype(np.int32)  # as bfloat16's test
DATA = PATTERN.reshape(-1, 17)  # two batches of 4, cycled
SCALE_NAMES = {loss_scale.SCALE, loss_scale.GOOD_STEPS}


def train_logged(cfg, until):
    """Trains cfg.model_path to step `until` on DATA; returns the scalars of each step it ran."""
    logged = []
    loop.train(cfg, placement_for(cfg), fixed_batches(DATA, cfg.train_batch_size), until=until,
               callbacks=[EachStep(lambda step, values: logged.append(dict(values)))])
    return logged


def stored(checkpoint) -> dict:
    """name -> value of every variable in a checkpoint."""
    return {name: tf.train.load_variable(checkpoint, name) for name, _ in tf.train.list_variables(checkpoint)}


@pytest.mark.slow
def test_float16_trains_close_to_float32(tmp_path):
    """Same run as bfloat16's test. float16 keeps 11 significant bits (a rounding unit of 2**-11 = 4.9e-4),
    bfloat16 8 (3.9e-3): bfloat16's test allows 2% (5 of its units), this one 5 of float16's, 0.25% (measured
    on this run: float16 4e-4, bfloat16 3e-3). The first step's gradient norm (same weights, same batch) is
    float32's: the gradients are unscaled. The loss scale stays at its initial 2**15: nothing overflows."""
    fp32 = tiny_config(lr=1e-2, model_path=str(tmp_path / "fp32"), train_steps=6, steps_per_checkpoint=6)
    fp16 = replace(fp32, precision="float16", model_path=str(tmp_path / "fp16"))
    a, b = train_logged(fp32, 6), train_logged(fp16, 6)
    losses_32, losses_16 = ([v["loss"] for v in run] for run in (a, b))
    assert losses_16[-1] < 0.7 * losses_16[0]
    np.testing.assert_allclose(losses_16, losses_32, rtol=2.5e-3)
    np.testing.assert_allclose(b[0]["grad_norm"], a[0]["grad_norm"], rtol=2.5e-3)
    assert [v["loss_scale"] for v in b] == [2.0 ** 15] * 6 and "loss_scale" not in a[0]
    weights = stored(checkpoints.latest(fp16.model_path))
    assert all(w.dtype == np.float32 for name, w in weights.items() if name.startswith("gpt2/"))  # float32 masters
    tokens = random_tokens([2, fp32.n_ctx])
    logits_32, logits_16 = (compute_logits(c, tokens, devices_for(c)) for c in (fp32, fp16))
    assert 1e-5 < np.abs(logits_16 - logits_32).max() < 0.01  # activations really are float16


def write_step_zero(cfg) -> str:
    """model.ckpt-0 of cfg's training graph at the seeded initial weights (what a run starts from)."""
    placement = placement_for(cfg)
    graph = tf.Graph()
    with graph.as_default():
        zeros = tf.zeros([cfg.train_batch_size, cfg.n_ctx], tf.int32)
        mesh, impl = meshes.placement_mesh(cfg, placement)
        lowered = training_step(cfg, mesh, impl, zeros, zeros)
    with MeshSession(graph, lowered.lowering, "", placement.session_config(), checkpoint=None) as session:
        return session.save(checkpoints.CheckpointWriter(cfg.model_path, session.saver), 0)


@pytest.mark.slow
def test_an_overflow_skips_the_update_and_halves_the_scale(tmp_path):
    """A loss scale of 2**40 makes the float16 gradients inf: both steps change no weight and no Adam slot,
    the global step still advances, the scale halves each time; HF's loader and tools/hf.py read the
    checkpoint as any other (the loss-scale variables sit under global_step/, which both skip)."""
    cfg = tiny_config(precision="float16", initial_loss_scale=2.0 ** 40, model_path=str(tmp_path / "run"),
                      train_steps=2, steps_per_checkpoint=1)
    start = stored(write_step_zero(cfg))
    assert start[loss_scale.SCALE] == 2.0 ** 40 and start[loss_scale.GOOD_STEPS] == 0
    logged = train_logged(cfg, 2)
    assert [v["loss_scale"] for v in logged] == [2.0 ** 40, 2.0 ** 39]
    assert all(np.isfinite(v["loss"]) and v["loss"] > 1 for v in logged)  # the forward pass is unaffected
    end = stored(checkpoints.latest(cfg.model_path))
    assert end["global_step"] == 2 and end[loss_scale.SCALE] == 2.0 ** 38 and end[loss_scale.GOOD_STEPS] == 0
    assert end.keys() == start.keys()
    for name, value in start.items():
        if name not in SCALE_NAMES | {"global_step"}:
            np.testing.assert_array_equal(end[name], value, err_msg=name)
    assert any("adam_m" in name for name in end)
    assert all(not np.any(end[name]) for name in end if "adam" in name)  # slots still at their initial zeros

    torch = pytest.importorskip("torch")
    from transformers import GPTNeoForCausalLM
    from transformers.models.gpt_neo.modeling_gpt_neo import load_tf_weights_in_gpt_neo
    checkpoint = checkpoints.latest(cfg.model_path)
    state = hf.hf_state_dict(cfg, checkpoint)
    model = load_tf_weights_in_gpt_neo(GPTNeoForCausalLM(hf.hf_config_for(cfg)), hf.hf_config_for(cfg), checkpoint)
    for key, value in state.items():
        assert torch.equal(model.state_dict()[key], torch.from_numpy(value)), key


@pytest.mark.slow
def test_the_scale_grows_after_its_window_and_a_resumed_run_keeps_it(tmp_path):
    """A float32 checkpoint (no loss scale) resumes in float16 with the initial scale; with a window of 2 the
    scale doubles after every 2 finite steps, and a resumed run goes on with the stored scale and count of
    finite steps. Variable names are the float32 run's plus the two loss-scale variables."""
    fp32 = tiny_config(model_path=str(tmp_path / "run"), train_steps=5, steps_per_checkpoint=100)
    fp16 = replace(fp32, precision="float16", initial_loss_scale=1024.0, loss_scale_window=2)
    train_logged(fp32, 1)
    names_32 = set(stored(checkpoints.latest(fp32.model_path)))
    first = train_logged(fp16, 4)  # steps 2, 3, 4
    assert [v["loss_scale"] for v in first] == [1024.0, 1024.0, 2048.0]
    at_4 = stored(checkpoints.latest(fp16.model_path))
    assert set(at_4) == names_32 | SCALE_NAMES
    assert at_4[loss_scale.SCALE] == 2048.0 and at_4[loss_scale.GOOD_STEPS] == 1
    resumed = train_logged(fp16, 5)  # step 5: the second finite step at 2048, which then doubles
    assert [v["loss_scale"] for v in resumed] == [2048.0]
    at_5 = stored(checkpoints.latest(fp16.model_path))
    assert at_5[loss_scale.SCALE] == 4096.0 and at_5[loss_scale.GOOD_STEPS] == 0


def run_mesh(build):
    """build(mesh) -> mtf tensors, on one CPU; their values as float32 numpy arrays."""
    graph = tf.Graph()
    with graph.as_default():
        mesh = mtf.Mesh(mtf.Graph(), "m")
        impl = mtf.placement_mesh_impl.PlacementMeshImpl(mtf.Shape([]), mtf.convert_to_layout_rules(""),
                                                         CPU_DEVICES[:1])
        outputs = build(mesh)
        lowering = mtf.Lowering(mesh.graph, {mesh: impl})
        fetches = [tf.cast(lowering.export_to_tf_tensor(t), tf.float32) for t in outputs]
        with tf.Session() as session:
            session.run(tf.global_variables_initializer())
            session.run(lowering.copy_masters_to_slices())
            return session.run(fetches)


@pytest.mark.parametrize("kernel", ["gelu", "layer_norm", "softmax", "global_attention", "local_attention",
                                    "scale_norm", "elish"])
def test_kernels_compute_float16_in_float32(kernel):
    """Each fused kernel, attention with its mask bias, ScaleNorm and the activations outside the fused GELU on
    float16 inputs whose float16 arithmetic would overflow (squares of ~1e3, attention logits of ~1e5, elish's
    exp(x) * 0 = NaN above x = 11): finite, and the float32 values (of the same, float16-rounded inputs) to
    float16's precision, forward and backward."""
    rng = np.random.RandomState(0)
    batch, seq, heads, kv = (mtf.Dimension(n, s) for n, s in (("batch", 2), ("sequence", 16), ("heads", 2),
                                                                ("features_per_head", 8)))
    shape = mtf.Shape([batch, seq, heads, kv])
    scale, offset = {"gelu": (30, 0), "layer_norm": (300, 500), "scale_norm": (300, 500), "softmax": (5, 0),
                     "elish": (10, 0)}.get(kernel, (150, 0))
    x, k, v, u = (rng.randn(*shape.to_integer_list) for _ in range(4))
    values = [scale * x + offset, scale * k, v, u, 1 + 0.1 * rng.randn(kv.size)]
    values = [value.astype(np.float16).astype(np.float32) for value in values]  # both runs see the same inputs
    ctx = AttentionContext(tiny_config(), False, seq, mtf.Dimension("memory_length", seq.size), kv)

    def build(dtype):
        def graph(mesh):
            x, k, v, u = (mtf.import_tf_tensor(mesh, tf.cast(value, dtype), shape) for value in values[:4])
            if kernel == "gelu":
                y = elementwise.gelu(x)
            elif kernel == "layer_norm":
                g = mtf.import_tf_tensor(mesh, tf.cast(values[4], dtype), mtf.Shape([kv]))
                y = elementwise.layer_norm(x, g, mtf.zeros(mesh, mtf.Shape([kv]), dtype), 1e-5)
            elif kernel == "scale_norm":
                y = layers.scale_norm(x, "scale_norm", mtf.VariableDType(tf.float32, tf.float32, dtype))
            elif kernel == "elish":
                y = activation_for("elish", dtype)(x)
            elif kernel == "softmax":
                y = attention.softmax(x, kv, split=False)
            else:  # models/attention.py's, with its causal (global) or window (local) mask bias
                y = ATTENTION[kernel.split("_")[0]].fn(x, k, v, ctx)
            loss = mtf.reduce_sum(mtf.cast(y, tf.float32) * mtf.cast(u, tf.float32))
            return [y] + mtf.gradients([loss], [x])
        return graph

    expected = run_mesh(build(tf.float32))
    got = run_mesh(build(tf.float16))
    for g, e in zip(got, expected):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, e, rtol=0, atol=0.01 * np.abs(e).max())


@pytest.mark.slow
def test_float16_decodes_like_float32():
    """Greedy kv-cache sampling picks the float32 model's tokens (the decoding step's mask bias is float32: -1e10
    times a float16 mask is -inf * 0 = NaN where visible)."""
    fp32 = tiny_config(local_attention_radius=4)
    tokens = random_tokens([2, fp32.n_ctx], seed=1)
    outputs = []
    for cfg in (fp32, replace(fp32, precision="float16")):
        options = SamplingOptions.from_config(cfg, max_new_tokens=6, padding_id=0, temperature=0.0)
        features = {"tokens": tokens, "prompt_length": np.array([3, 5], np.int32), "seed": np.array([7, 7], np.int32)}
        outputs.append(run_predict(cfg, features, devices_for(cfg), options=options)["tokens"])
    np.testing.assert_array_equal(outputs[1], outputs[0])


def test_float16_config_checks():
    assert tiny_config(precision="float16").loss_scale_window == 2000
    with pytest.raises(ConfigError, match="'float16'"):
        tiny_config(precision="half")
    with pytest.raises(ConfigError, match="initial_loss_scale"):
        tiny_config(precision="float16", initial_loss_scale=0.5)
    simd = object.__new__(mtf.simd_mesh_impl.SimdMeshImpl)  # what the TPU loop lowers to
    with pytest.raises(ConfigError, match="set precision to bfloat16"):
        loss_scale.for_training(tiny_config(precision="float16"), None, simd)
    assert loss_scale.for_training(tiny_config(precision="bfloat16"), None, simd) is None


def test_an_overflow_at_a_loss_scale_above_1_is_skipped_and_at_1_stops_the_run():
    """train/divergence.py's reading of a float16 step: inf gradients at a scale above 1 are loss scaling's
    skipped step (the run goes on, as the overflow test above trains through two of them); at a scale of 1
    halving cannot help and the run stops; a non-finite loss stops it at any scale. Bug caught: a stop on every
    overflow (float16 runs die at their first skipped step) or on none at scale 1 (skipping forever)."""
    inf = float("inf")
    assert divergence.problem({"loss": 4.0, "grad_norm": inf, "loss_scale": 2.0}) is None
    assert "loss scale 1" in divergence.problem({"loss": 4.0, "grad_norm": inf, "loss_scale": 1.0})
    assert divergence.problem({"loss": inf, "grad_norm": inf, "loss_scale": 2.0 ** 15}) == "loss inf, grad_norm inf"
    assert divergence.problem({"loss": 4.0, "grad_norm": inf}) == "grad_norm inf"  # no loss scaling: a stop
