"""Stopping on a signal without losing work: Ctrl-C (SIGINT) in a terminal, SIGTERM from a cluster's scheduler.

SLURM (at the time limit, on `scancel`, or before preempting a job) and Kubernetes (before deleting or
evicting a pod) send SIGTERM and, a grace period later, SIGKILL. Training treats SIGTERM like the first Ctrl-C:
it finishes the step in progress, saves a checkpoint and exits non-zero with one line (`StopOnSignal`, used by
train/loop.py). Outside the training loop (start-up, graph building) SIGTERM ends the run at once with one line
(`Terminated`, raised by the handler `terminate_with_a_line` installs): nothing since the last checkpoint is
lost there. A non-chief task of a multi-host run keeps serving on SIGTERM (`DeferredSignal`): the chief saves
through it, so it leaves only when the chief releases it.

Every handler here is installed by `install`, which makes it act in the process that installed it only: a fork
(a library's worker pool: lm-eval's bootstrap, multiprocessing's) inherits the handler but not the run it
serves, and ends quietly on SIGTERM, as its pool asks. While one of them handles SIGTERM, every fork holds
SIGTERM blocked from just before it until the child's own after-fork steps are done (`_hold_sigterm_for_fork`),
so a SIGTERM sent to a child still being forked waits for it instead of being lost.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Optional

from execution.callbacks import Callback, Run


def name(signum: int) -> str:
    return signal.Signals(signum).name


def exit_code(signum: int) -> int:
    """A shell's code for a process ended by `signum` (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(signum)


def install(signum: int, handler):
    """signal.signal(signum, handler), with the handler acting only in this process; returns the handler before,
    which signal.signal puts back. A forked child (lm-eval's bootstrap pool, any library's multiprocessing
    workers) inherits Python's handlers, and ours belong to the run of the process that installed them: in a
    worker, Terminated came out as a traceback after a run that had succeeded (pool.terminate() sends SIGTERM),
    and StopOnSignal noted a stop no loop would read, so the worker never ended and its pool waited for it. There
    the signal does what it does with no handler (`_default_action`)."""
    installer = os.getpid()

    def in_the_installing_process(signum, frame):
        if os.getpid() != installer:
            _default_action(signum)  # does not return
        return handler(signum, frame)

    in_the_installing_process.installed_by = installer
    return signal.signal(signum, in_the_installing_process)


_held_for_fork = threading.local()  # the forking thread's signal mask before _hold_sigterm_for_fork blocked SIGTERM


def _hold_sigterm_for_fork() -> None:
    """Before a fork (os.register_at_fork), while a handler of `install`'s takes SIGTERM: SIGTERM blocked in the
    forking thread, whose mask the child inherits. CPython clears the signals a child received while it was being
    forked (before its after-fork hooks run), so a pool's terminate() that reached a worker still being forked
    was lost, and the pool waited for that worker forever (data/create_tfrecords.py met it in its own pool).
    Blocked, the signal stays pending until `_release_sigterm_after_fork` unblocks it, and then the inherited
    handler ends the child (`install`)."""
    if getattr(signal.getsignal(signal.SIGTERM), "installed_by", None) is not None:
        _held_for_fork.previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _release_sigterm_after_fork() -> None:
    """After a fork, in the parent and in the child: the mask before `_hold_sigterm_for_fork`, if it held."""
    previous = getattr(_held_for_fork, "previous", None)
    if previous is not None:
        _held_for_fork.previous = None
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_hold_sigterm_for_fork, after_in_parent=_release_sigterm_after_fork,
                        after_in_child=_release_sigterm_after_fork)


def _default_action(signum: int) -> None:
    """The signal's default action, in this process: for SIGINT and SIGTERM, the end of it, without a word."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(exit_code(signum))  # not reached: the default action ends the process before kill returns


class Terminated(KeyboardInterrupt):
    """SIGTERM outside the training loop: the run stops where it is (the last checkpoint is intact)."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(f"stopped by {name(signum)}; the last checkpoint is intact")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)


@contextlib.contextmanager
def terminate_with_a_line():
    """While open, SIGTERM raises Terminated (main.py prints its one line and exits 143) instead of killing the
    process silently; the handler before is put back on exit. Only in the main thread (signal handlers cannot
    be installed elsewhere).

    Terminated is raised wherever the signal finds the program, which may be half-way into a `with` whose exit
    then fails in its own way: TensorFlow's variable_scope, entered but not yet recorded, raises "Improper
    nesting of variable_scope" while a graph is being built (the memory check's, 3 of 4 tries). Once SIGTERM
    came, whatever leaves the block is reported as the Terminated it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []

    def raise_terminated(signum, frame):
        received.append(signum)
        raise Terminated(signum)

    previous = install(signal.SIGTERM, raise_terminated)
    try:
        yield
    except Terminated:
        raise
    except BaseException:
        if received:
            raise Terminated(received[0]) from None
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


class _SignalHandlers:
    """A context that, while open, routes `signals` to `self._handle` and puts the handlers in place before back
    on exit. Only in the main thread (signal handlers cannot be installed elsewhere)."""

    signals: tuple = ()

    def _handle(self, signum, frame) -> None:
        raise NotImplementedError

    def __enter__(self):
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self._previous[signum] = install(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}


class StopOnSignal(_SignalHandlers, Callback):
    """While open, the first SIGINT or SIGTERM asks the loop to stop after the current step (`requested`, and
    `signum` says which); a second SIGINT stops at once (KeyboardInterrupt), a second SIGTERM too (Terminated).
    The handlers in place before are put back on exit. A subclass may also `poll` for a stop asked for elsewhere
    (devices/cluster.py: a worker of the cluster that got SIGTERM).

    As a callback of the training loop (every run has the placement's: `Placement.stop_watcher`) it is open from
    the run's on_open to its on_end, and after each step asks the run to stop when a stop was requested."""

    signals = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, say=print):
        self._requested = False
        self.signum: Optional[int] = None
        self._say = say
        self._run: Optional[Run] = None  # the training run this watcher stops, while it is open as its callback

    @property
    def requested(self) -> bool:
        if not self._requested:
            self.poll()
        return self._requested

    def poll(self) -> None:
        """Looks for a stop asked for outside this process (`request` it); nothing here."""

    def _handle(self, signum, frame):
        if self._requested:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Terminated(signum)
        self.request(signum)

    def request(self, signum: int, why: str = "") -> None:
        """Stop after this step, as if this process had received `signum` (`why` says where it came from)."""
        if self._requested:
            return
        self._requested, self.signum = True, signum
        if self._run is not None:
            self._run.stop(signum)
        again = "Ctrl-C again" if signum == signal.SIGINT else f"{name(signum)} again"
        self._say(f"\n{name(signum)}{why}: stopping after this step and saving a checkpoint ({again} to stop at once)",
                  flush=True)

    def on_open(self, run: Run) -> None:
        self._run = run
        self.__enter__()
        if not self._requested:
            self.poll()
        if self._requested:  # asked for before the run opened (a worker's SIGTERM, or the caller's `request`)
            run.stop(self.signum)

    def on_step(self, run: Run, step: int, values: dict) -> None:
        if not self._requested:
            self.poll()  # a stop asked for elsewhere is requested here, which stops the run

    def on_end(self, run: Run, step: int) -> None:
        self.__exit__(None, None, None)
        self._run = None


class DeferredSignal(_SignalHandlers):
    """While open, SIGTERM is noted (`received`) with one line instead of ending the process: a non-chief task
    serves until the chief, which saves through it, releases it."""

    def __init__(self, note: str, signals=(signal.SIGTERM,)):
        self.received: Optional[int] = None
        self._note, self.signals = note, signals

    def _handle(self, signum, frame):
        if self.received is None:
            print(f"{name(signum)}: {self._note}", file=sys.stderr, flush=True)
        self.received = signum
