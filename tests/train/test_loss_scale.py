"""train/loss_scale.py: float16's dynamic loss scaling. A step whose gradients overflow changes no weight and no
optimizer slot and halves the scale; finite steps in a row double it; checkpoints keep its state, and a config
asks for it with precision "float16" (not on a TPU)."""
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from schema import ConfigError
from config import replace
from modelpath import checkpoints
from execution import meshes
from execution.mesh_session import MeshSession
from tiny import fixed_batches, placement_for, tiny_config
from tools import hf
from execution.callbacks import EachStep
from train import loop, loss_scale
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

