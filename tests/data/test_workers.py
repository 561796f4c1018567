"""data/workers.py: worker processes with a pipe each: order, a worker's exception, a lost worker, the end.

The hangs these guard end a test by pytest-timeout's mark (60 s) instead of stalling the suite."""

import errno
import os
import signal
import time

import pytest

from data import workers as workers_module
from data.workers import RemoteTraceback, WorkerLost, Workers

WORKER_STATE: dict = {}


def no_setup():
    pass


def square_slowly(item):
    time.sleep(0.05 * (item % 3))  # later items often finish first
    return item * item


def test_answers_come_in_the_items_order_with_passthroughs_in_place():
    items = [0, 1, "kept", 2, 3, 4, "kept too", 5, 6, 7]
    with Workers(3, no_setup, (), square_slowly) as workers:
        answers = list(workers.imap(items, passthrough=lambda item: isinstance(item, str)))
    assert answers == [item if isinstance(item, str) else item * item for item in items]


def fail_on_two(item):
    if item == 2:
        raise OSError(errno.ENOSPC, "No space left on device", "/out")
    return item


def test_a_workers_exception_is_raised_in_the_parent_with_its_traceback():
    with Workers(2, no_setup, (), fail_on_two) as workers:
        answers = workers.imap(range(5))
        assert [next(answers), next(answers)] == [0, 1]
        with pytest.raises(OSError) as raised:
            next(answers)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == "/out"
    assert isinstance(raised.value.__cause__, RemoteTraceback) and "fail_on_two" in str(raised.value.__cause__)


def die_on_two(item):
    if item == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's out-of-memory killer does
    return item


@pytest.mark.timeout(60)
def test_a_worker_killed_from_outside_is_an_error_naming_how_not_a_wait():
    """multiprocessing.Pool, used before, replaced a killed worker and waited for its task's result forever.
    Bug caught: the workers' sentinels left out of the wait (a test that fails by its timeout)."""
    with Workers(2, no_setup, (), die_on_two) as workers:
        with pytest.raises(WorkerLost, match="killed by SIGKILL, most often the system out of memory"):
            list(workers.imap(range(6)))


def fail_first_sleep_after(item):
    if item == 0:
        raise ValueError("the first item fails")
    time.sleep(40)  # bounded: with the bug below, the interpreter's exit waits for it too


@pytest.mark.timeout(20)
def test_leaving_ends_busy_workers_at_once():
    """An error (a full disk, Ctrl-C) leaves while other workers are mid-item: they are killed, not waited for.
    Bug caught: close() joining before it kills (the test fails by its timeout)."""
    started = time.monotonic()
    with pytest.raises(ValueError):
        with Workers(2, no_setup, (), fail_first_sleep_after) as workers:
            list(workers.imap(range(4)))
    assert time.monotonic() - started < 10
    assert all(process.exitcode == -signal.SIGKILL for process in workers._processes)


def record_start():
    WORKER_STATE["blocked at start"] = WORKER_STATE.pop("mask at entry") & set(workers_module.INTERRUPTIONS)


def report_signals(item):
    for number in reversed(workers_module.INTERRUPTIONS):  # SIGTERM first: not ignored, it ends the worker
        os.kill(os.getpid(), number)  # ignored: the worker answers
    blocked_now = signal.pthread_sigmask(signal.SIG_BLOCK, []) & set(workers_module.INTERRUPTIONS)
    handlers = [signal.getsignal(number) for number in workers_module.INTERRUPTIONS]
    return WORKER_STATE["blocked at start"], blocked_now, handlers


def test_workers_are_forked_with_interruptions_held_then_ignore_them(monkeypatch):
    """SIGINT and SIGTERM are blocked from before the fork until the worker ignores them: one arriving in between
    would otherwise run the parent's Python handler in the worker (a KeyboardInterrupt traceback from a worker
    at Ctrl-C). Stopping is the parent's: it kills its workers. Bugs caught: the parent not blocking them, the
    worker not ignoring them or not unblocking them, the parent's mask not put back."""
    real_serve = workers_module._serve

    def recording_serve(*args):
        WORKER_STATE["mask at entry"] = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        real_serve(*args)

    monkeypatch.setattr(workers_module, "_serve", recording_serve)
    with Workers(2, record_start, (), report_signals) as workers:
        answers = list(workers.imap(range(2)))
    interruptions = set(workers_module.INTERRUPTIONS)
    assert answers == [(interruptions, set(), [signal.SIG_IGN, signal.SIG_IGN])] * 2
    assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & interruptions  # the parent can be interrupted again


def test_a_parent_that_is_pid_1_keeps_its_workers(monkeypatch):
    """A container's first process (create_tfrecords as its command) is PID 1: a worker checks that its parent
    is the one that forked it, not that its parent is not PID 1. Bug caught: `os.getppid() == 1` taken for a
    dead parent (every worker ended at once, the run a WorkerLost)."""
    import types
    monkeypatch.setattr(workers_module, "os", types.SimpleNamespace(getpid=lambda: 1, getppid=lambda: 1, _exit=os._exit))
    with Workers(2, no_setup, (), square_slowly) as workers:
        assert list(workers.imap(range(4))) == [0, 1, 4, 9]


def test_a_worker_that_cannot_be_started_is_a_worker_lost_and_the_started_ones_end(monkeypatch):
    """fork() failing for the second worker (ENOMEM: a parent of many GB; EAGAIN: the process limit): a
    WorkerLost naming the reason (main() prints it as one line), the first worker killed and reaped. Bug caught:
    the process listed before it started (close() then fails on it with an AttributeError that hides the
    reason)."""
    import multiprocessing.context
    real_start = multiprocessing.context.ForkProcess.start
    started = []

    def start(process):
        if started:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        real_start(process)
        started.append(process)

    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", start)
    with pytest.raises(WorkerLost, match=r"could not be started \(Cannot allocate memory\)"):
        Workers(2, no_setup, (), square_slowly)
    assert started[0].exitcode == -signal.SIGKILL


def test_how_a_worker_ended_is_named_for_every_signal():
    """A real-time signal has no name in `signal.Signals`: the line still says how the worker ended (bug: the
    ValueError of the lookup replacing the WorkerLost)."""
    assert workers_module.ended_how(-signal.SIGKILL) == "killed by SIGKILL, most often the system out of memory"
    assert workers_module.ended_how(-signal.SIGRTMIN - 1) == f"killed by signal {signal.SIGRTMIN + 1}"
    assert workers_module.ended_how(3) == "exit code 3"
