"""Preemption (issue 22): SIGTERM, what SLURM and Kubernetes send before they kill a job, stops training after the
step in progress with a checkpoint and one line, like the first Ctrl-C, and the run resumes exactly;
--checkpoint_minutes saves on the clock."""
import json
import os
import re
import signal

import numpy as np
import pytest

import main
from config import replace
from modelpath import checkpoints
from execution.preemption import StopOnSignal
from tiny import fixed_batches, model_weights, placement_for, random_tokens, tiny_config, train
from execution import callbacks, preemption
from execution.callbacks import EachStep
from train import loop
from workspace import make_workspace, start_main, wait_for_line

LOSS = re.compile(r"step +(\d+)/\d+ \| loss ([0-9.]+)")
# lr independent of train_steps (lr_decay_end fixed), so a run cut short and a shorter run schedule alike
MODEL = dict(n_layer=1, attention_types=[[["global"], 1]], train_steps=400, steps_per_checkpoint=1000,
             lr_decay_end=1000)


def with_train_steps(config, steps, model_path):
    """A copy of the config with another train_steps and model_path."""
    model = json.loads(open(config).read())
    model.update(train_steps=steps, model_path=str(model_path))
    path = os.path.join(os.path.dirname(config), f"tiny_{os.path.basename(str(model_path))}.json")
    with open(path, "w") as f:
        json.dump(model, f)
    return path


@pytest.mark.slow
def test_sigterm_saves_after_the_step_says_so_and_the_run_resumes_exactly(tmp_path, capsys):
    config = make_workspace(tmp_path, **MODEL)
    model_path = str(tmp_path / "run")
    process = start_main("--model", config, "--log_every", "1", "--peak_tflops", "1")
    try:
        wait_for_line(process, r"step +1/400 \| loss")
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143, (process.returncode, err[-3000:])
    errors = [line for line in err.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("stopped by SIGTERM at step "), err[-3000:]
    assert "SIGTERM: stopping after this step and saving a checkpoint" in out
    stopped = int(re.search(r"at step (\d+)", errors[0]).group(1))
    assert 1 <= stopped < 400 and checkpoints.steps(model_path) == [stopped]
    assert checkpoints.prefix_of(model_path, stopped) in errors[0]

    # Resumed to 3 steps further, it matches a run that was never interrupted.
    resumed_config = with_train_steps(config, stopped + 3, model_path)
    capsys.readouterr()
    assert main.main(["--model", resumed_config, "--log_every", "1", "--peak_tflops", "1"]) == 0
    resumed = LOSS.findall(capsys.readouterr().out)
    straight_config = with_train_steps(config, stopped + 3, tmp_path / "straight")
    assert main.main(["--model", straight_config, "--log_every", "1", "--peak_tflops", "1"]) == 0
    straight = LOSS.findall(capsys.readouterr().out)
    assert [int(s) for s, _ in resumed] == list(range(stopped + 1, stopped + 4))
    assert resumed == straight[stopped:]
    straight_weights = model_weights(tmp_path / "straight")
    for name, value in model_weights(model_path).items():
        np.testing.assert_array_equal(value, straight_weights[name], err_msg=name)


@pytest.mark.slow
def test_sigterm_in_the_loop_stops_after_the_step_with_exit_code_143(tmp_path):
    """... and at a checkpoint's step the loop's callbacks (the evaluations) do not run: the run stops at once.
    (Bug: callbacks run after a save made while a stop was asked for.)"""
    data = random_tokens([16, 17], seed=21)
    cfg = tiny_config(model_path=str(tmp_path / "run"), train_steps=5, steps_per_checkpoint=2)
    called = Recorder()

    def preempt(step, values):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(loop.Interrupted) as stopped:
        loop.train(cfg, placement_for(cfg), fixed_batches(data, cfg.train_batch_size), callbacks=[EachStep(preempt), called])
    assert stopped.value.step == 2 and stopped.value.exit_code == 143 and "SIGTERM" in str(stopped.value)
    assert checkpoints.steps(cfg.model_path) == [2] and called.checkpoints == []
    assert signal.getsignal(signal.SIGTERM) is before  # the handler was put back

    # Stopped before the first step of a new run: nothing to save, and the line says so.
    fresh = replace(cfg, model_path=str(tmp_path / "fresh"))
    stop = StopOnSignal(say=lambda *a, **k: None)
    stop.request(signal.SIGTERM)
    with pytest.raises(loop.Interrupted) as stopped:
        loop.train(fresh, placement_for(fresh), fixed_batches(data, cfg.train_batch_size), [stop])
    assert stopped.value.step == 0 and "nothing saved" in str(stopped.value)
    assert checkpoints.steps(fresh.model_path) == []


@pytest.mark.slow
def test_checkpoint_minutes_saves_on_the_clock(tmp_path, monkeypatch):
    """... and the loop's callbacks run at the steps_per_checkpoint saves only (here the last step), with the
    checkpoint just written. (Bug: callbacks after every save, the clock's included.)"""
    called = Recorder()
    data = random_tokens([16, 17], seed=22)
    cfg = tiny_config(model_path=str(tmp_path / "run"), train_steps=5, steps_per_checkpoint=100, keep_checkpoint_max=10)
    now = [0.0]
    monkeypatch.setattr(callbacks, "clock", lambda: now[0])

    def minutes_pass(step, values):
        now[0] += 60 * (2 if step == 3 else 1)  # step 3 takes two minutes, the others one

    loop.train(cfg, placement_for(cfg), fixed_batches(data, cfg.train_batch_size), 
               [EachStep(minutes_pass), loop.CheckpointOnTheClock(minutes=2), called])
    # saves when two minutes passed since the last save (after steps 2, 3 and 5), and at the end
    assert checkpoints.steps(cfg.model_path) == [2, 3, 5]
    assert called.checkpoints == [(5, checkpoints.prefix_of(cfg.model_path, 5))]


class Recorder(callbacks.Callback):
    """A training loop's callback (execution/callbacks.py) that notes the checkpoints it is called with."""

    def __init__(self):
        self.checkpoints = []

    def on_checkpoint(self, run, step: int, prefix: str) -> None:
        assert os.path.exists(prefix + ".index")  # written before the callback runs
        self.checkpoints.append((step, prefix))


def test_sigterm_that_breaks_a_with_on_its_way_out_is_still_the_one_sigterm_line(capsys, monkeypatch):
    """SIGTERM while the memory check built its graph gave `RuntimeError: Improper nesting of variable_scope`
    (3 of 4 tries): the signal's exception met a TensorFlow scope entered half-way, whose exit raised its own.
    Here a scope whose exit fails like that one, around the signal, in main.py's run."""
    class BreaksOnExit:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            raise RuntimeError("Improper nesting of variable_scope.")

    def run(args):
        with BreaksOnExit():
            os.kill(os.getpid(), signal.SIGTERM)  # delivered to this thread before os.kill returns
            raise AssertionError("SIGTERM was not delivered")

    monkeypatch.setattr(main, "run", run)
    assert main.main(["--model", "default"]) == 143
    assert capsys.readouterr().err == "stopped by SIGTERM; the last checkpoint is intact\n"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler before is back

    def fails(args):  # without a signal, the failure is what it is
        with BreaksOnExit():
            pass

    monkeypatch.setattr(main, "run", fails)
    with pytest.raises(RuntimeError, match="Improper nesting"):
        main.main(["--model", "default"])


@pytest.mark.slow
def test_sigterm_to_a_worker_of_two_hosts_makes_the_chief_save_and_both_resume_exactly(tmp_path, capsys):
    """A scheduler preempting one host of a multi-host run: the worker keeps serving, asks the chief to stop, the
    chief saves (through the worker: each host saves its variables) and releases it; both exit 143. The run
    resumed (here on one process with two devices) continues as an uninterrupted one."""
    from tests.scenarios.test_multihost import free_ports
    # Nothing split (each host computes the whole step): a resume on one process continues the two-host run's
    # losses; with the batch split over the hosts they drift apart in the last bits over a hundred steps.
    # Longer steps (n_ctx 128, batch 8): the stop comes within some ten steps (the worker looks at its signals every
    # quarter second), before the two-host run and one process drift apart in the last bits of the losses.
    config = make_workspace(tmp_path, **MODEL, mesh_shape="x:2", layout="", n_ctx=128, train_batch_size=8)
    model_path = str(tmp_path / "run")
    workers = ",".join(f"127.0.0.1:{port}" for port in free_ports(2))
    worker = start_main("--model", config, "--workers", workers, "--task_index", "1", "--worker_timeout", "240")
    chief = start_main("--model", config, "--workers", workers, "--task_index", "0", "--log_every", "1",
                       "--peak_tflops", "1")
    try:
        wait_for_line(chief, r"step +1/400 \| loss")
        worker.send_signal(signal.SIGTERM)
        chief_out, chief_err = chief.communicate(timeout=120)
        worker_out, worker_err = worker.communicate(timeout=60)
    finally:
        for process in (chief, worker):
            if process.poll() is None:
                process.kill()
    assert chief.returncode == 143, (chief.returncode, chief_err[-3000:])
    assert "SIGTERM on worker 1: stopping after this step" in chief_out, chief_out[-3000:]
    errors = [line for line in chief_err.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("stopped by SIGTERM at step "), chief_err[-3000:]
    assert worker.returncode == 143 and "released by the chief after SIGTERM" in worker_out, worker_out + worker_err
    stopped = int(re.search(r"at step (\d+)", errors[0]).group(1))
    assert checkpoints.steps(model_path) == [stopped]
    assert os.path.exists(checkpoints.prefix_of(model_path, stopped) + ".data-00001-of-00002")  # the worker's shard

    resumed_config = with_train_steps(config, stopped + 2, model_path)
    two_devices = ["--gpu_ids", "device:CPU:0", "device:CPU:1", "--log_every", "1", "--peak_tflops", "1"]
    capsys.readouterr()
    assert main.main(["--model", resumed_config, *two_devices]) == 0
    resumed = LOSS.findall(capsys.readouterr().out)
    assert main.main(["--model", with_train_steps(config, stopped + 2, tmp_path / "straight"), *two_devices]) == 0
    straight = LOSS.findall(capsys.readouterr().out)
    assert [int(s) for s, _ in resumed] == [stopped + 1, stopped + 2]
    assert resumed == straight[stopped:]
    straight_weights = model_weights(tmp_path / "straight")
    for name, value in model_weights(model_path).items():
        # equal up to the last bits: the two hosts compute in other processes (thread pools, op order) than one
        np.testing.assert_allclose(value, straight_weights[name], rtol=1e-4, atol=1e-6, err_msg=name)


# A process that forks a pool of workers inside one of execution/preemption.py's handlers (argv[1] names it), as
# lm-eval's bootstrap does inside main.py's terminate_with_a_line or a training run's evaluation: the workers are
# busy when the pool is ended, so each of them gets the pool's SIGTERM. preemption.py is read as a file (it
# imports nothing of the project), so the process starts without TensorFlow.
FORKED_POOL = r'''
import importlib.util, multiprocessing, sys, time
spec = importlib.util.spec_from_file_location("preemption", "execution/preemption.py")
preemption = importlib.util.module_from_spec(spec)
spec.loader.exec_module(preemption)
handlers = {"terminate_with_a_line": preemption.terminate_with_a_line, "StopOnSignal": preemption.StopOnSignal,
            "DeferredSignal": lambda: preemption.DeferredSignal("the chief releases this task")}
context = multiprocessing.get_context("fork")
started = context.Queue()

def work(index):
    started.put(index)
    time.sleep(60)  # longer than the timeout below; not forever, should a worker outlive its parent

with handlers[sys.argv[1]]():
    pool = context.Pool(2)
    pool.map_async(work, range(2))
    for _ in range(2):
        started.get(timeout=60)
    pool.terminate()  # SIGTERM to every worker still running, as `with mp.Pool(...)` does at its end
    pool.join()
print("pool ended")
'''


@pytest.mark.parametrize("handler", ["terminate_with_a_line", "StopOnSignal", "DeferredSignal"])
def test_a_forked_worker_ends_quietly_when_its_pool_ends_it(handler):
    """A handler acts only in the process that installed it: a forked pool worker (lm-eval's bootstrap pool under
    main.py, any library's) ends quietly on the SIGTERM its pool sends, with no traceback, and the process that
    forked it goes on.
    Bug caught: the pid check in preemption.install removed (terminate_with_a_line: each worker printed
    `Process ForkPoolWorker-N: Traceback ... Terminated: stopped by SIGTERM`; StopOnSignal and DeferredSignal:
    the workers noted a stop and slept on, and pool.join() waited for them until the timeout)."""
    from workspace import run_python
    ended = run_python(FORKED_POOL, handler, timeout=30)
    assert ended.returncode == 0 and ended.stdout == "pool ended\n", (ended.stdout, ended.stderr)
    assert ended.stderr == ""



def test_a_fork_holds_sigterm_until_the_child_can_take_it_while_our_handler_is_in_place(monkeypatch):
    """While a handler of preemption.install takes SIGTERM, every fork blocks it just before and puts the mask
    back after, in the parent and in the child (os.register_at_fork), so a SIGTERM reaching a child still being
    forked is pending until the child can end on it (CPython clears what arrived before its after-fork hooks);
    with no handler of ours, forks are left alone. The parent's side is watched here (the child's mask is put
    back before any code of a test could look).
    Bugs caught: the hooks not registered, the hold without the mask put back, the hold whatever the handler."""
    calls = []
    real = signal.pthread_sigmask
    monkeypatch.setattr(signal, "pthread_sigmask", lambda how, mask: calls.append((how, set(mask))) or real(how, mask))

    def forked():
        calls.clear()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        return list(calls)

    before = real(signal.SIG_BLOCK, [])
    assert forked() == []  # the test process's own handler: no hold
    previous = preemption.install(signal.SIGTERM, lambda *a: None)
    try:
        held = forked()
        assert held[0] == (signal.SIG_BLOCK, {signal.SIGTERM}) and held[1] == (signal.SIG_SETMASK, set(before)), held
        assert real(signal.SIG_BLOCK, []) == before
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert forked() == []
