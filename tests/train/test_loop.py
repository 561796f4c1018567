"""Training behaviour: equivalence across mesh layouts, resume (also from the TF 2.15 Estimator's checkpoints),
what a checkpoint holds, atomic saves, retention and Ctrl-C."""
import json
import os
import shutil
import signal

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from config import replace
from modelpath import checkpoints, files
from execution import runner
from execution.callbacks import EachStep
from train import loop
from train.divergence import Diverged
from tiny import fixed_batches, model_weights, placement_for, random_tokens, tiny_config, train

LAYOUTS = [
    ("all:1", ""),                          # one device
    ("x:2", "batch:x"),                     # data parallel over 2 devices
    ("x:2,y:2", "batch:x,heads:y"),         # data x model parallel, heads split
    ("x:2,y:2", "batch:x,embd:y"),          # data x model parallel, embedding split
]


@pytest.mark.slow
def test_layouts_give_the_same_losses_and_weights(tmp_path):
    data = random_tokens([16, 17], seed=10)
    results = {}
    for mesh_shape, layout in LAYOUTS:
        cfg = tiny_config(mesh_shape=mesh_shape, layout=layout, train_steps=3, lr=1e-3,
                          model_path=str(tmp_path / f"{mesh_shape}-{layout}".replace(":", "_").replace(",", "_")))
        results[(mesh_shape, layout)] = (train(cfg, data), model_weights(cfg.model_path))
    reference_losses, reference_weights = results[LAYOUTS[0]]
    assert len(reference_losses) == 3
    for key, (losses, weights) in results.items():
        np.testing.assert_allclose(losses, reference_losses, atol=1e-5, err_msg=str(key))
        assert weights.keys() == reference_weights.keys()
        for name, value in weights.items():
            # Split layouts sum in another order; Adam divides by sqrt(v), so for near-zero gradients that
            # rounding can move a weight by up to ~lr per step. 2e-5 bounds that at lr 1e-3 over 3 steps.
            np.testing.assert_allclose(value, reference_weights[name], atol=2e-5, rtol=0, err_msg=f"{key} {name}")
    # The weights moved (so equal weights mean equal updates, not untouched initial values).
    assert reference_losses[0] != reference_losses[-1]


def expected_variables(cfg):
    names = {"gpt2/wte", "gpt2/wpe", "gpt2/ln_f/g", "gpt2/ln_f/b"}
    for i in range(cfg.n_layer):
        names |= {f"gpt2/h{i}/{n}" for n in (
            "norm_1/g", "norm_1/b", "norm_2/g", "norm_2/b", "attn/q", "attn/k", "attn/v", "attn/o",
            "attn/compute_output_bias/o_b", "mlp/conv1d_main/c_fc/kernel", "mlp/conv1d_main/c_fc/bias",
            "mlp/conv1d_main/c_proj/kernel", "mlp/conv1d_main/c_proj/bias")}
    return names


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """One uninterrupted run that the resume, save and Ctrl-C tests compare with: the config and data of the
    TF 2.15 Estimator's checkpoint (tests/fixtures/make_tf215_checkpoint.py: 4 steps, a checkpoint every 2, 16
    rows of seed 21, so one pass over the data), its losses and its final weights. Read it, never write it."""
    data = random_tokens([16, 17], seed=21)
    cfg = tiny_config(model_path=str(tmp_path_factory.mktemp("straight") / "run"), train_steps=4,
                      steps_per_checkpoint=2)
    losses = train(cfg, data)
    return cfg, data, losses, model_weights(cfg.model_path)


def test_checkpoint_holds_gpt_neo_variables_with_their_shapes(straight):
    cfg = straight[0]
    shapes = dict(tf.train.list_variables(checkpoints.latest(cfg.model_path)))
    model_vars = {n for n in shapes if n.startswith("gpt2/") and "adam" not in n}
    assert model_vars == expected_variables(cfg)
    d = cfg.n_embd
    assert shapes["gpt2/wte"] == [cfg.n_vocab, d] and shapes["gpt2/wpe"] == [cfg.n_ctx, d]
    assert shapes["gpt2/h0/attn/q"] == [d, d] and shapes["gpt2/h1/attn/o"] == [d, d]
    assert shapes["gpt2/h0/mlp/conv1d_main/c_fc/kernel"] == [d, 4 * d]
    assert shapes["gpt2/h0/mlp/conv1d_main/c_proj/kernel"] == [4 * d, d]
    assert shapes["global_step"] == []
    # Adam's slots exist for every trainable variable (so resume restores optimizer state too).
    assert {n[:-len("/adam_m")] for n in shapes if n.endswith("/adam_m")} == expected_variables(cfg)


def test_training_reduces_loss_on_learnable_data(tmp_path):
    # A repeating sequence is learnable in a few steps; random tokens are not.
    pattern = np.tile(np.arange(8), 40)[:17 * 8].reshape(8, 17).astype(np.int32)
    cfg = tiny_config(model_path=str(tmp_path / "run"), train_steps=20, lr=1e-2)
    losses = train(cfg, pattern)
    assert np.mean(losses[-3:]) < 0.6 * np.mean(losses[:3])


# The checkpoint the Estimator wrote on TensorFlow 2.15 (tests/fixtures/make_tf215_checkpoint.py): this config
# and data, stopped at step 2 of 4.
ESTIMATOR_FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "tf215_estimator")


def test_a_checkpoint_the_tf215_estimator_wrote_resumes_here(straight, tmp_path):
    cfg, data, straight_losses, straight_weights = straight
    resumed = replace(cfg, model_path=str(tmp_path / "resumed"))
    shutil.copytree(ESTIMATOR_FIXTURE, resumed.model_path)
    assert checkpoints.steps(resumed.model_path)[-1] == 2
    # Weights and Adam's state restored: the last two steps are the straight run's, to rounding (the first two
    # ran on TF 2.15's kernels; Adam divides by sqrt(v), which magnifies that rounding for near-zero gradients,
    # as in test_layouts_give_the_same_losses_and_weights).
    np.testing.assert_allclose(train(resumed, data), straight_losses[2:], atol=1e-5)
    for name, value in straight_weights.items():
        np.testing.assert_allclose(model_weights(resumed.model_path)[name], value, atol=2e-5, err_msg=name)


@pytest.mark.slow
def test_a_save_cut_short_leaves_the_last_checkpoint_whole_and_is_cleaned_up(straight, tmp_path, monkeypatch):
    straight_cfg, data, _, straight_weights = straight
    cfg = replace(straight_cfg, model_path=str(tmp_path / "run"))
    rename = files.rename  # every move of a save (modelpath/files.py: os.replace here, gfile for buckets)

    def dies_at_the_index(source, target):
        if source.endswith("model.ckpt-4.index"):
            raise OSError("killed")  # the data shards of step 4 were moved, its index was not
        return rename(source, target)

    monkeypatch.setattr(files, "rename", dies_at_the_index)
    with pytest.raises(OSError, match="killed"):
        train(cfg, data)
    monkeypatch.setattr(files, "rename", rename)
    assert checkpoints.steps(cfg.model_path) == [2]  # step 4 does not exist: its index never arrived
    assert any(name.startswith(checkpoints.STAGING) for name in os.listdir(cfg.model_path))
    assert checkpoints.latest(cfg.model_path).endswith("model.ckpt-2")

    assert train(cfg, data) and checkpoints.steps(cfg.model_path) == [2, 4]  # resumed from step 2
    leftovers = [n for n in os.listdir(cfg.model_path) if n.startswith(checkpoints.STAGING)]
    assert leftovers == []
    for name, value in straight_weights.items():
        np.testing.assert_array_equal(model_weights(cfg.model_path)[name], value, err_msg=name)


def test_retention_keeps_the_newest_checkpoints_and_never_one_it_did_not_list(straight, tmp_path):
    """Continues a copy of the straight run (model.ckpt-2 and -4, both listed) to step 6 with a checkpoint every
    step and 2 kept: 5 and 6 stay, 2 and 4 go, and a copy of step 4 as step 0 that the state file does not list
    stays. Bug caught: rotating by the files found instead of the files listed (step 0 deleted)."""
    straight_cfg, data, _, _ = straight
    cfg = replace(straight_cfg, model_path=str(tmp_path / "run"), train_steps=6, steps_per_checkpoint=1,
                  keep_checkpoint_max=2)
    shutil.copytree(straight_cfg.model_path, cfg.model_path)  # the state file names its checkpoints relatively
    # A checkpoint the state file does not list (as tools/hf.py's imported step 0 would be, or one kept by
    # keep_checkpoint_every_n_hours) is never deleted.
    for name in os.listdir(cfg.model_path):
        if name.startswith("model.ckpt-4."):
            shutil.copy(os.path.join(cfg.model_path, name), os.path.join(cfg.model_path, name.replace("-4.", "-0.")))
    assert checkpoints.steps(cfg.model_path) == [0, 2, 4]
    train(cfg, data)
    assert checkpoints.steps(cfg.model_path) == [0, 5, 6]
    state = tf.train.get_checkpoint_state(cfg.model_path)
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == ["model.ckpt-5", "model.ckpt-6"]
    assert os.path.basename(state.model_checkpoint_path) == "model.ckpt-6"


@pytest.mark.slow
def test_ctrl_c_stops_after_the_step_with_its_checkpoint_and_the_run_resumes_exactly(straight, tmp_path):
    """... and the resumed run (a new graph and session: weights and Adam's state restored) continues the step
    count and the straight run's loss curve. Bug caught: the input pipeline handed step 0 on a resume (the first
    batches trained again)."""
    straight_cfg, data, straight_losses, _ = straight
    # No scheduled checkpoint before the end: the one at step 2 is the interruption's.
    cfg = replace(straight_cfg, model_path=str(tmp_path / "run"), steps_per_checkpoint=4)
    first = []

    def press_ctrl_c(step, values):
        first.append(float(values["loss"]))
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)  # as a terminal would, between session calls or during one

    with pytest.raises(loop.Interrupted) as stopped:
        loop.train(cfg, placement_for(cfg), fixed_batches(data, cfg.train_batch_size), callbacks=[EachStep(press_ctrl_c)])
    assert stopped.value.step == 2 and "saved" in str(stopped.value)
    assert checkpoints.steps(cfg.model_path) == [2]
    assert int(tf.train.load_variable(checkpoints.latest(cfg.model_path), "global_step")) == 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler was put back
    np.testing.assert_allclose(first, straight_losses[:2], atol=1e-5)

    rest = train(cfg, data)
    assert int(tf.train.load_variable(checkpoints.latest(cfg.model_path), "global_step")) == 4
    assert len(rest) == 2
    np.testing.assert_allclose(rest, straight_losses[2:], atol=1e-6)


def test_a_non_finite_loss_inside_a_call_of_several_steps_names_its_own_step(tmp_path, monkeypatch):
    """On a TPU one session call runs `iterations` steps (devices/tpu.py's LoopSteps); the steps of CPU devices
    run three per call stand in for it here. lr 1e30: step 1's update leaves weights of order 1e30 and step 2's loss is
    not finite. The run stops at step 2, the middle of the call, and saves nothing (no model.ckpt-3 after the
    call). Bug caught: checking only each call's last step (the error would name step 3)."""
    monkeypatch.setattr(runner.StepPerCall, "steps_per_call", 3)
    cfg = tiny_config(lr=1e30, train_steps=3, steps_per_checkpoint=3, model_path=str(tmp_path / "run"))
    seen = []
    with pytest.raises(Diverged, match=r"diverged at step 2: loss (nan|inf)"):
        loop.train(cfg, placement_for(cfg), fixed_batches(random_tokens([8, 17], seed=3), cfg.train_batch_size),
                   callbacks=[EachStep(lambda step, values: seen.append(step))])
    assert seen == [1, 2] and checkpoints.steps(cfg.model_path) == []


@pytest.mark.slow
def test_a_run_evaluating_at_every_checkpoint_builds_its_programs_once_and_evaluates_each_checkpoint(tmp_path,
                                                                                                     monkeypatch):
    """train/job.py with eval_steps and a checkpoint every step: one training program and one evaluation program
    for the whole run (one session each, on a mesh of two devices: masters and slices apart), the same losses as a run that does not evaluate, and each checkpoint's
    validation loss the one a fresh evaluation of that checkpoint gives; infer/run.py's Predictor (the eval tasks'
    and the harness's scoring) moved to another checkpoint scores as a fresh one. Bugs caught: training in chunks
    again (a program and session per checkpoint), Validation.loss building its program at every checkpoint, or
    not restoring the kept session (stale weights: every checkpoint gets the first one's loss), MeshSession.restore
    not copying the restored masters to the slices, and Predictor.restore leaving a kept session at its old
    checkpoint. Two steps, a checkpoint each, are enough for all of these (a program per checkpoint makes 3,
    stale weights give one loss for both); each more costs a fresh evaluation's program."""
    from config import load_config
    from evals import validation
    from infer import run
    from train import progress
    from train.job import TrainOptions, run_training
    from workspace import make_workspace

    built, opened, losses = [], [], {}
    program_init, program_open, log_step = runner.Program.__init__, runner.Program.open, progress.Progress.step

    def counted_init(self, cfg, placement, step, inputs, steps_per_call=1, seed=None, **kwargs):
        built.append(type(inputs).__name__)
        program_init(self, cfg, placement, step, inputs, steps_per_call, seed, **kwargs)

    monkeypatch.setattr(runner.Program, "__init__", counted_init)
    monkeypatch.setattr(runner.Program, "open", lambda self, *a, **k: opened.append(self) or program_open(self, *a, **k))
    monkeypatch.setattr(progress.Progress, "step", lambda self, step, values, now: losses.setdefault(
        self.cfg.model_path, []).append(float(values["loss"])) or log_step(self, step, values, now))
    cfg = load_config(make_workspace(tmp_path, train_steps=2, steps_per_checkpoint=1, eval_steps=2,
                                     precision="float32", mesh_shape="x:2", layout="batch:x"))
    placement = placement_for(cfg)
    # MFU's denominator given: devices/peaks.py measures a peak once per process, but where this test is the
    # process's first training (run alone, or first on its xdist worker) that is ~6 CPU seconds of matmuls
    given_peak = TrainOptions(peak_tflops=1.0)
    assert run_training(cfg, placement, given_peak) == 2
    assert len(built) == 2 and len(opened) == 2  # training's program and the validation's, a session each

    with open(os.path.join(cfg.model_path, "eval_results.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [(r["task"], r["step"]) for r in records] == [("validation", 1), ("validation", 2)]
    evaluation = validation.Validation(cfg, placement)
    for record in records:
        fresh, _ = validation.evaluate(cfg, placement, evaluation.batches, evaluation.steps,
                                       checkpoints.prefix_of(cfg.model_path, record["step"]))
        assert record["loss"] == pytest.approx(fresh, rel=1e-6)
    assert len({r["loss"] for r in records}) == 2

    plain = replace(cfg, eval_steps=0, model_path=str(tmp_path / "plain"))
    assert run_training(plain, placement, given_peak) == 2
    np.testing.assert_allclose(losses[cfg.model_path], losses[plain.model_path], rtol=1e-6)

    rows = {"tokens": random_tokens([2, cfg.n_ctx], vocab=cfg.n_vocab), "targets": random_tokens([2, cfg.n_ctx],
                                                                                                vocab=cfg.n_vocab)}
    last = checkpoints.prefix_of(cfg.model_path, 2)
    with run.Predictor(cfg, placement, checkpoints.prefix_of(cfg.model_path, 1)) as predictor:
        first = predictor.predict(rows, 2)["token_loss"]
        predictor.restore(last)
        moved = predictor.predict(rows, 2)["token_loss"]
    np.testing.assert_allclose(moved, run.predict(cfg, placement, rows, 2, last)["token_loss"], rtol=1e-6)
    assert not np.allclose(first, moved)
