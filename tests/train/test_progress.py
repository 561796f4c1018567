"""train/progress.py: the progress line's rates (tok/s, FLOP/s per device, MFU) and the throughput the trackers
record, measured over the run's training time."""
import pytest

from config import replace
from execution import callbacks
from models import flops
from tiny import tiny_config
from train.progress import Progress
from train.trackers import Tracker


class Scalars(Tracker):
    """A stand-in tracker that keeps the scalars the trackers record."""

    def __init__(self, progress):
        super().__init__(progress)
        self.scalars = {}

    def record(self, step, scalars):
        self.scalars.update(scalars)


def logged_speed(cfg, peak_flops, seconds_per_step, monkeypatch):
    """The progress line and scalars of step 2, one step of `seconds_per_step` after an untimed step 1."""
    lines = []
    progress = Progress(cfg, every=1, peak_flops=peak_flops, print_fn=lambda line, **_: lines.append(line))
    tracker = Scalars(progress)
    for step, now in ((1, 100.0), (2, 100.0 + seconds_per_step)):
        values = {"loss": 1.0, "learning_rate": 1e-3}
        progress.step(step, values, now)
        tracker.on_step(None, step, values)
    return lines[-1], tracker.scalars


def test_mfu_divides_the_meshs_flops_per_device_by_one_devices_peak(monkeypatch):
    one = tiny_config(train_steps=10)
    four = replace(one, mesh_shape="x:4", layout="batch:x")
    flops_per_step = one.train_batch_size * one.n_ctx * flops.training_flops_per_token(one)
    peak = 2 * flops_per_step  # one device at this peak does a step in 0.5 s: MFU 50% at 1 s per step
    line_1, scalars_1 = logged_speed(one, peak, 1.0, monkeypatch)
    line_4, scalars_4 = logged_speed(four, peak, 1.0, monkeypatch)
    assert scalars_1["model_flops_per_sec"] == scalars_4["model_flops_per_sec"] == pytest.approx(flops_per_step)
    assert scalars_1["model_flops_per_sec_per_device"] == pytest.approx(flops_per_step)
    assert scalars_4["model_flops_per_sec_per_device"] == pytest.approx(flops_per_step / 4)
    assert scalars_1["mfu"] == pytest.approx(0.5)
    assert scalars_4["mfu"] == pytest.approx(scalars_1["mfu"] / 4)  # same step time on four devices: a quarter
    assert "| MFU 50.0% |" in line_1 and "| MFU 12.5% |" in line_4
    assert f"| {flops_per_step / 1e9:.2f} GFLOP/s/device |" in line_1
    assert f"| {flops_per_step / 4e9:.2f} GFLOP/s/device |" in line_4
    no_peak, scalars = logged_speed(four, 0.0, 1.0, monkeypatch)
    assert "MFU" not in no_peak and "mfu" not in scalars


def test_the_rate_leaves_out_the_time_of_an_evaluation_at_a_checkpoint(monkeypatch):
    """Steps 1 to 3 at 1 s each with a 10 s evaluation after step 2 (train/loop.py runs the on_checkpoint hooks
    inside Run.paused): the line at step 3 shows 1 step/s, not 2 steps in 12 s. (Bug: Run.training_seconds not
    leaving out the paused time.)"""
    now = [100.0]
    monkeypatch.setattr(callbacks, "clock", lambda: now[0])
    cfg = tiny_config(train_steps=10)
    run = callbacks.Run(cfg, placement=None, program=None, session=None, start=0, until=10)
    lines = []
    progress = Progress(cfg, every=1, peak_flops=0.0, print_fn=lambda line, **_: lines.append(line))
    progress.on_open(run)
    for step in (1, 2, 3):
        now[0] += 1.0
        progress.on_step(run, step, {"loss": 1.0, "learning_rate": 1e-3})
        if step == 2:
            with run.paused():  # the evaluation at step 2's checkpoint
                now[0] += 10.0
    assert lines[0].startswith("running step 1, the session's first: ")  # on_open's, before the first call
    steps = lines[1:]
    assert "| 1.00 steps/s |" in steps[1] and "| 1.00 steps/s |" in steps[2]
