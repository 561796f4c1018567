"""The experiment trackers (train/trackers.py): W&B offline, and its refusal without the package."""
import glob
import os
import sys

import pytest

from config import replace
from execution.callbacks import EachStep
from schema import ConfigError
from tiny import fixed_batches, placement_for, random_tokens, tiny_config
from train import loop
from train.progress import Progress
from train.trackers import TensorBoard, WandB, check_wandb, run_id


@pytest.mark.slow
def test_wandb_offline_records_the_training_scalars_in_model_path(tmp_path):
    """A run with `wandb_project` writes an offline W&B run in model_path/wandb holding the scalars the progress
    line's steps logged (loss, learning_rate), under the run id of the model_path. Bug caught:
    Tracker.on_step recording at no step (`shown == step` never true, e.g. comparing to the run's start)."""
    cfg = tiny_config(model_path=str(tmp_path / "run"), train_steps=3, steps_per_checkpoint=3, wandb_project="t")
    data = random_tokens([8, cfg.n_ctx + 1], seed=5)
    progress = Progress(cfg, every=1, peak_flops=0.0, print_fn=lambda *a, **k: None)
    losses = []
    loop.train(cfg, placement_for(cfg), fixed_batches(data, cfg.train_batch_size),
               [progress, EachStep(lambda step, values: losses.append(float(values["loss"]))), TensorBoard(progress),
                WandB(progress, {"n_layer": cfg.n_layer})])
    runs = glob.glob(os.path.join(cfg.model_path, "wandb", "offline-run-*", "run-*.wandb"))
    assert len(runs) == 1 and run_id(cfg.model_path) in runs[0]
    with open(runs[0], "rb") as f:
        written = f.read()
    assert b"loss" in written and b"learning_rate" in written and len(losses) == 3


def test_wandb_project_without_the_package_is_one_error_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(ConfigError) as info:
        check_wandb(replace(tiny_config(), wandb_project="mine"))
    assert "pip install wandb" in str(info.value) and "\n" not in str(info.value)
    check_wandb(tiny_config())  # no project: nothing needed


def test_wandb_mode_is_checked_with_the_config():
    with pytest.raises(ConfigError) as info:
        tiny_config(wandb_project="mine", wandb_mode="cloud")
    assert "wandb_mode" in str(info.value) and "offline" in str(info.value)
