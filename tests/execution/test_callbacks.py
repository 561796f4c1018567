"""execution/callbacks.py and the loop that calls them (train/loop.py): the order of the hooks, the run's
requests, and what a callback that fails leaves."""
import pytest

from execution import callbacks
from execution.callbacks import Callback, EachStep
from modelpath import checkpoints
from tiny import fixed_batches, placement_for, random_tokens, tiny_config
from train import loop


class Journal(Callback):
    """Notes every hook it sees, in one list shared by several callbacks."""

    def __init__(self, name, seen, fail_on_open=False):
        self.name, self.seen, self.fail_on_open = name, seen, fail_on_open

    def on_open(self, run):
        self.seen.append((self.name, "open", run.start))
        if self.fail_on_open:
            raise RuntimeError("refused")

    def on_step(self, run, step, values):
        self.seen.append((self.name, "step", step))

    def on_checkpoint(self, run, step, prefix):
        self.seen.append((self.name, "checkpoint", step))

    def on_end(self, run, step):
        self.seen.append((self.name, "end", step))


@pytest.mark.slow
def test_hooks_run_in_order_and_on_end_in_reverse_for_the_opened_only(tmp_path):
    """Two callbacks over 2 steps with a checkpoint each: on_open in order before any step, each step's hooks in
    order, on_checkpoint after the save, on_end in reverse; and when the second callback's on_open fails, only
    the first one's on_end runs and nothing trained. Bugs caught: on_end for callbacks never opened, or in
    the given order."""
    cfg = tiny_config(model_path=str(tmp_path / "run"), train_steps=2, steps_per_checkpoint=1)
    data = random_tokens([8, cfg.n_ctx + 1], seed=2)
    seen = []
    loop.train(cfg, placement_for(cfg), fixed_batches(data, cfg.train_batch_size),
               [Journal("a", seen), Journal("b", seen)])
    assert seen == [("a", "open", 0), ("b", "open", 0),
                    ("a", "step", 1), ("b", "step", 1), ("a", "checkpoint", 1), ("b", "checkpoint", 1),
                    ("a", "step", 2), ("b", "step", 2), ("a", "checkpoint", 2), ("b", "checkpoint", 2),
                    ("b", "end", 2), ("a", "end", 2)]

    seen.clear()
    failing = tiny_config(model_path=str(tmp_path / "failing"), train_steps=2, steps_per_checkpoint=1)
    with pytest.raises(RuntimeError):
        loop.train(failing, placement_for(failing), fixed_batches(data, cfg.train_batch_size),
                   [Journal("a", seen), Journal("b", seen, fail_on_open=True), Journal("c", seen)])
    assert seen == [("a", "open", 0), ("b", "open", 0), ("a", "end", 0)]
    assert checkpoints.steps(failing.model_path) == []


@pytest.mark.slow
def test_a_stop_asked_by_a_callback_saves_that_step_and_raises_interrupted(tmp_path):
    """`run.stop(signum)` from on_step: the loop saves that step and stops with Interrupted naming it."""
    import signal

    class StopAtTwo(Callback):
        def on_step(self, run, step, values):
            if step == 2:
                run.stop(signal.SIGTERM)

    cfg = tiny_config(model_path=str(tmp_path / "run"), train_steps=5, steps_per_checkpoint=100)
    data = random_tokens([8, cfg.n_ctx + 1], seed=3)
    steps = []
    with pytest.raises(loop.Interrupted) as stopped:
        loop.train(cfg, placement_for(cfg), fixed_batches(data, cfg.train_batch_size),
                   [EachStep(lambda step, values: steps.append(step)), StopAtTwo()])
    assert steps == [1, 2] and stopped.value.step == 2 and stopped.value.exit_code == 143
    assert checkpoints.steps(cfg.model_path) == [2]


def test_training_seconds_leave_out_the_paused_time(monkeypatch):
    now = [50.0]
    monkeypatch.setattr(callbacks, "clock", lambda: now[0])
    run = callbacks.Run(cfg=None, placement=None, program=None, session=None, start=0, until=1)
    now[0] = 53.0
    with run.paused():
        now[0] = 60.0
    now[0] = 61.0
    assert run.training_seconds() == pytest.approx(4.0)
