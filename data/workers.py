"""Worker processes that encode in parallel, each with a pipe of its own, ended by SIGKILL.

Why not `multiprocessing.Pool`: its workers share one result queue and that queue's lock. A worker killed from
outside (the system out of memory) took its task with it and the pool waited for the result forever; a worker
ended by the pool's terminate() while it held the lock (mid-way through sending a result) left terminate()
itself waiting (a 7-minute stall seen in the test suite). Here nothing is shared between workers, the parent
sees a worker's end on its pipe and names a lost worker in an error, and ending the workers is a SIGKILL and
a reap, which cannot wait on anything.

A worker ignores Ctrl-C and SIGTERM: stopping is the parent's, which kills its workers and cleans up, and on
Linux a worker is killed with its parent too (kill -9 of the parent).
"""

from __future__ import annotations

import collections
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import traceback
from typing import Any, Callable, Iterable, Iterator, Optional

INTERRUPTIONS = (signal.SIGINT, signal.SIGTERM)
PR_SET_PDEATHSIG = 1


class WorkerLost(RuntimeError):
    """A worker process could not be started, or ended while it had work (killed from outside: most often the
    system out of memory)."""


class RemoteTraceback(Exception):
    """A worker's traceback, attached as the cause of the exception it raised there."""

    def __str__(self) -> str:
        return self.args[0]


def ended_how(exitcode: Optional[int]) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:  # a real-time signal has no name
            name = f"signal {-exitcode}"
        return f"killed by {name}" + (", most often the system out of memory" if name == "SIGKILL" else "")
    return f"exit code {exitcode}"


class Workers:
    """`count` forked processes, each running `initializer(*initargs)` once and then `work(item)` per item.

    Use as a context manager: leaving it kills every worker (finished or not) and reaps it.
    """

    def __init__(self, count: int, initializer: Callable, initargs: tuple, work: Callable):
        context = multiprocessing.get_context("fork")
        self._processes: list = []
        self._connections: list = []  # the parent's ends, one per worker
        self._idle: list = []  # (process, connection) of workers waiting for an item
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTIONS)  # see _serve
        try:
            for _ in range(count):
                ours, theirs = context.Pipe()
                inherited = [*self._connections, ours]  # the parent's ends, which this fork copies
                self._connections.append(ours)
                process = context.Process(target=_serve, args=(theirs, inherited, os.getpid(), initializer, initargs, work),
                                          daemon=True)
                try:
                    process.start()
                finally:
                    theirs.close()  # so that workers forked later do not hold it
                self._processes.append(process)  # started: close() may kill and reap it
                self._idle.append((process, ours))
        except BaseException as exc:
            self.close()
            if isinstance(exc, OSError):  # fork's ENOMEM or EAGAIN: the memory or the process limit
                raise WorkerLost(f"a worker process could not be started ({exc.strerror or exc})") from exc
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Idle workers end on their pipe's end of file; busy ones are killed, their items abandoned."""
        for connection in self._connections:
            connection.close()
        for process in self._processes:
            if process.exitcode is None:
                process.kill()
        for process in self._processes:
            process.join()

    def imap(self, items: Iterable, passthrough: Callable[[Any], bool] = lambda item: False) -> Iterator:
        """`work(item)` of each item, in the items' order; an item for which `passthrough` is true comes out as
        it went in, in its place. A worker holds one item at a time, so at most `count` items are in flight. A
        worker's exception is raised here (its traceback as the cause); a worker that ends is a WorkerLost."""
        items = iter(items)
        order: collections.deque = collections.deque()  # [done, value] per item, in the items' order
        busy: dict = {}  # connection -> (process, its entry in order)
        exhausted = False
        while True:
            while self._idle and not exhausted:
                item = next(items, _END)
                if item is _END:
                    exhausted = True
                elif passthrough(item):
                    order.append([True, item])
                else:
                    process, connection = self._idle.pop()
                    entry = [False, None]
                    order.append(entry)
                    busy[connection] = (process, entry)
                    try:
                        connection.send(item)
                    except (BrokenPipeError, ConnectionResetError):
                        process.join()
                        raise WorkerLost(f"a worker process ({ended_how(process.exitcode)}) ended before its work began") from None
            while order and order[0][0]:
                yield _value(order.popleft()[1])
            if exhausted and not order:
                return
            self._receive(busy)

    def _receive(self, busy: dict) -> None:
        """Waits until at least one busy worker answers or ends, and files its answer. A worker holds the only
        copy of its pipe's far end (the parent closes its own at the start), so its end is an end of file here."""
        for connection in multiprocessing.connection.wait(list(busy)):
            process, entry = busy.pop(connection)
            try:
                answer = connection.recv()
            except (EOFError, OSError):
                process.join()
                raise WorkerLost(f"a worker process ended while encoding ({ended_how(process.exitcode)})") from None
            entry[:] = [True, answer]
            self._idle.append((process, connection))


_END = object()


def _value(answer):
    if isinstance(answer, tuple) and len(answer) == 3 and answer[0] is _Raised:
        _, exc, text = answer
        raise exc from RemoteTraceback(text)
    return answer


class _Raised:
    """Marks a worker's answer that is an exception (a class, so it pickles as a reference)."""


def _serve(connection, inherited: list, parent: int, initializer: Callable, initargs: tuple, work: Callable) -> None:
    """A worker's life: answer each item with work(item), or the exception it raised, until the parent goes.

    SIGINT and SIGTERM have been blocked since before the fork (Workers), so none reaches the parent's Python
    handlers inherited here; they are ignored, then unblocked, and any that arrived meanwhile is dropped."""
    for number in INTERRUPTIONS:
        signal.signal(number, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, INTERRUPTIONS)
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent:  # the parent died before prctl took effect (not `== 1`: it may be PID 1)
            os._exit(1)
    for other in inherited:  # held here, an earlier worker's pipe would never reach its end of file
        other.close()
    failure = None
    try:
        initializer(*initargs)
    except BaseException as exc:  # answered to every item: the parent raises it where it reads the first answer
        failure = exc
    while True:
        try:
            item = connection.recv()
        except EOFError:  # the parent closed its end
            return
        try:
            if failure is not None:
                raise failure
            answer = work(item)
        except BaseException as exc:
            answer = (_Raised, exc, traceback.format_exc())
        try:
            connection.send(answer)
        except Exception as unpicklable:  # the exception (or result) cannot be pickled: its text goes instead
            connection.send((_Raised, RuntimeError(f"{type(unpicklable).__name__}: {unpicklable}: {answer!r}"[:2000]),
                             traceback.format_exc()))
