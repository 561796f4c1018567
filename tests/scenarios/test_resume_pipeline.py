"""Resuming through the real input pipeline: main.py -> train/job.py -> data/inputs.py on tfrecords, as a user
runs it. The other resume tests feed tests/tiny.fixed_batches and so never see what job.py hands the pipeline.

Bugs these catch: train/job.py's `batches` giving the pipeline `start_step=0` (or mask_dataset `first_step=0`),
or train/loop.py asking for `batches(0)`, so a resumed run silently re-reads the first batches; a
mixed-datasets stream that restarts its source choices."""
import json

import numpy as np
import pytest

import main
from data import inputs, mlm
from tiny import model_weights
from train import job
from workspace import make_workspace

# One layer, two datasets mixed (the workspace's train and eval tfrecords), so that a resumed stream must
# also continue each source's documents and the choice between the two where the straight run was; the
# learning rate decays over 6 steps whatever train_steps is, so the first 3 steps are the straight run's.
MODEL = dict(n_layer=1, attention_types=[[["global"], 1]], train_steps=6, steps_per_checkpoint=3, lr_decay_end=6,
             datasets=[["tiny", 4, "documents_random", 0.6], ["tiny_eval", 4, "documents_random", 0.4]])


def write_config(root, name, **changes):
    model = json.loads((root / "configs" / "tiny.json").read_text())
    model.update(changes)
    path = root / "configs" / f"{name}.json"
    path.write_text(json.dumps(model))
    return str(path)


def losses_logged(model_path) -> dict:
    """step -> the training loss TensorBoard got (float32, as the step computed it), over all runs."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
    events = EventMultiplexer()
    events.AddRunsFromDirectory(str(model_path))
    events.Reload()
    logged = {}
    for run in events.Runs():
        if "loss" in events.Runs()[run].get("scalars", []):
            logged.update({event.step: event.value for event in events.Scalars(run, "loss")})
    return logged


def train(config, *args) -> None:
    assert main.main(["--model", config, "--peak_tflops", "1", "--log_every", "1", *args]) == 0


def spy(calls, name, real):
    def wrapped(*args, **kwargs):
        calls.append((name, kwargs.get("start_step", kwargs.get("first_step"))))
        return real(*args, **kwargs)
    return wrapped


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A straight 6-step run and one trained to 3, then resumed to 6 (a new main.py run), same config; and per
    run, the step train/job.py asked data/inputs.train_dataset and data/mlm.mask_dataset to start at."""
    root = tmp_path_factory.mktemp("resume")
    make_workspace(root, **MODEL)
    registry = root / "configs" / "dataset_configs"
    entry = json.loads((registry / "tiny.json").read_text())
    (registry / "tiny_eval.json").write_text(json.dumps(dict(entry, path=entry["eval_path"], eval_path=None)))
    starts = []
    with pytest.MonkeyPatch.context() as patch:
        calls = []
        patch.setattr(job, "train_dataset", spy(calls, "train_dataset", inputs.train_dataset))
        patch.setattr(job, "mask_dataset", spy(calls, "mask_dataset", mlm.mask_dataset))
        for name, steps in (("straight", 6), ("resumed", 3), ("resumed", 6)):
            train(write_config(root, name, model_path=str(root / name), train_steps=steps))
            starts.append(list(calls))
            calls.clear()
    return root / "straight", root / "resumed", starts


@pytest.mark.slow
def test_a_resumed_run_trains_on_what_the_straight_run_trained_on(runs):
    straight, resumed, _ = runs
    straight_losses, resumed_losses = losses_logged(straight), losses_logged(resumed)
    assert sorted(straight_losses) == sorted(resumed_losses) == [1, 2, 3, 4, 5, 6]
    # Distinct batches give distinct losses: equal losses at steps 4-6 mean the same batches were read there.
    assert len({round(float(v), 4) for v in straight_losses.values()}) == 6
    for step, loss in straight_losses.items():
        assert abs(resumed_losses[step] - loss) < 1e-5, (step, resumed_losses[step], loss)
    straight_weights, resumed_weights = model_weights(straight), model_weights(resumed)
    assert straight_weights.keys() == resumed_weights.keys()
    for name, value in straight_weights.items():
        np.testing.assert_allclose(resumed_weights[name], value, atol=2e-5, rtol=0, err_msg=name)


@pytest.mark.slow
def test_the_pipeline_starts_at_the_restored_step(runs):
    _, _, starts = runs
    assert starts == [[("train_dataset", 0), ("mask_dataset", 0)],   # straight, from scratch
                      [("train_dataset", 0), ("mask_dataset", 0)],   # the first 3 steps
                      [("train_dataset", 3), ("mask_dataset", 3)]]   # resumed at the checkpoint of step 3
