"""The watch on a cluster's other tasks: the chief's on its workers, and each worker's on its chief.

A worker that ends before the chief releases it (killed, its host gone) leaves the chief waiting inside
TensorFlow without a limit, in its step or in closing the session whose step failed: seen, a worker killed -9
mid-training and the chief silent for 240 s and on, holding its launcher's allocation. A worker whose chief is
gone waits for a release that cannot come. So a thread connects to each watched server every second; a task that
answered once and then refuses connections three times in a row (nothing listens on its port), or answers none
for a minute (its host down or cut off), is gone, and `on_gone` is told: the chief ends with one error line
(devices/cluster._worker_gone), a worker leaves with exit code 3 (devices/cluster.serve). Nothing can be saved
then: a step needs every host's devices, and each host saves the variables it holds; the run resumes from its
last checkpoint.

A task not yet reached is not judged: tasks start in any order (the chief's session waits for its workers). A
connection is a TCP connect to the server's port, closed at once: it needs the process to be there, not its
attention, so a busy task answers."""
from __future__ import annotations

import socket
import threading
import time
from typing import Callable, Optional

# A refused connection says the host is up and nothing listens on the port: the server is gone (a TF server never
# stops listening), judged after MISSES rounds, ~3 s. Anything else (a timeout, an unreachable network, a name that
# does not resolve) may pass, so it is judged only after UNREACHABLE_S without an answer. Rounds come often, so a
# task that ends soon after it started serving has been seen first; a connection costs the task nothing.
INTERVAL_S = 1.0      # between rounds of connections
MISSES = 3            # missed rounds in a row, at the least, that make a task gone
UNREACHABLE_S = 60.0  # without an answer, for reasons other than a refused connection
CONNECT_TIMEOUT_S = 5.0
REFUSED = "connection refused"


def missed(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> Optional[str]:
    """Why a connection to "host:port" failed ("connection refused", "timed out", ...), or None when it was made."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except socket.timeout:
        return "timed out"
    except ConnectionRefusedError:
        return REFUSED
    except OSError as e:
        return (e.strerror or type(e).__name__).lower()


class TaskWatch:
    """Watches `tasks` ({task: "host:port"}) from a daemon thread until `stop` (or the end of a `with`); calls
    `on_gone(task, address, reason)` once, for the first task found gone, and stops watching."""

    def __init__(self, tasks: dict, on_gone: Callable[[int, str, str], None], interval_s: float = INTERVAL_S,
                 misses: int = MISSES, unreachable_s: float = UNREACHABLE_S,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S):
        self.tasks, self.on_gone = dict(tasks), on_gone
        self.interval_s, self.misses, self.unreachable_s = interval_s, misses, unreachable_s
        self.connect_timeout_s = connect_timeout_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="task_watch", daemon=True)

    def start(self) -> "TaskWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        """No more judgements: the watched tasks are about to end as they should (the chief releasing its workers)."""
        self._stopped.set()

    def __enter__(self) -> "TaskWatch":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _watch(self) -> None:
        answered, misses = {}, {task: 0 for task in self.tasks}  # the time of each task's last answer
        while not self._stopped.wait(self.interval_s):
            for task, address in self.tasks.items():
                reason = missed(address, self.connect_timeout_s)
                if self._stopped.is_set():
                    return
                if reason is None:
                    answered[task] = time.monotonic()
                    misses[task] = 0
                elif task in answered:
                    misses[task] += 1
                    silent_s = time.monotonic() - answered[task]
                    if misses[task] >= self.misses and (reason == REFUSED or silent_s >= self.unreachable_s):
                        self.on_gone(task, address, reason)
                        return
