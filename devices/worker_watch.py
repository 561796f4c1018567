"""The chief's watch on its workers. A worker that ends before the chief releases it (killed, its host gone) leaves
the chief waiting inside TensorFlow without a limit, in its step or in closing the session whose step failed: seen,
a worker killed -9 mid-training and the chief silent for 240 s and on, holding its launcher's allocation. So a thread connects to each worker's server every
second; a worker that answered once and then misses `misses` connections in a row is gone, and the
chief is told (`on_gone`: it ends with one error line). Nothing can be saved then: the step in flight needs the
worker's devices, and each host saves the variables it holds; the run resumes from its last checkpoint.

A worker not yet seen is not judged: the chief's session waits for every task to start, since launchers start
them in any order. A connection is a TCP connect to the server's port, closed at once: it needs the worker's
process to be there, not its attention, so a busy worker answers."""
from __future__ import annotations

import socket
import threading
from typing import Callable, Optional

# A refused connection (the host is up, the process is not) takes MISSES rounds, ~3 s; a host that does not answer
# at all, MISSES connection timeouts more (~18 s). Often, so a worker that ends soon after it started serving has
# been seen first; a connection costs the worker nothing it would notice.
INTERVAL_S = 1.0      # between rounds of connections
MISSES = 3            # missed rounds in a row that make a worker gone
CONNECT_TIMEOUT_S = 5.0


def missed(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> Optional[str]:
    """Why a connection to "host:port" failed ("connection refused", "timed out", ...), or None when it was made."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except socket.timeout:
        return "timed out"
    except OSError as e:
        return (e.strerror or type(e).__name__).lower()


class WorkerWatch:
    """Watches `workers` ({task: "host:port"}) from a daemon thread until `stop`; calls
    `on_gone(task, address, reason)` once, for the first worker found gone, and stops watching."""

    def __init__(self, workers: dict, on_gone: Callable[[int, str, str], None], interval_s: float = INTERVAL_S,
                 misses: int = MISSES, connect_timeout_s: float = CONNECT_TIMEOUT_S):
        self.workers, self.on_gone = dict(workers), on_gone
        self.interval_s, self.misses, self.connect_timeout_s = interval_s, misses, connect_timeout_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="worker_watch", daemon=True)

    def start(self) -> "WorkerWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        """No more judgements: the chief is releasing its workers, which then end."""
        self._stopped.set()

    def _watch(self) -> None:
        seen, misses = set(), {task: 0 for task in self.workers}
        while not self._stopped.wait(self.interval_s):
            for task, address in self.workers.items():
                reason = missed(address, self.connect_timeout_s)
                if self._stopped.is_set():
                    return
                if reason is None:
                    seen.add(task)
                    misses[task] = 0
                elif task in seen:
                    misses[task] += 1
                    if misses[task] >= self.misses:
                        self.on_gone(task, address, reason)
                        return
