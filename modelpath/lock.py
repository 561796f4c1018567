"""One trainer per model_path: an advisory lock file, `model_path/.trainer.lock`, holding the host, pid and start
time of the training process that owns the folder.

Two trainers on one model_path destroy each other's work (the second one's start-up removes what it takes for the
leftovers of a killed save: the first one's save in progress). The lock is taken atomically (O_CREAT | O_EXCL,
which NFS v3+ and local file systems honour) before training touches model_path, and removed when training ends.
A lock left by a process that died without removing it (kill -9, a lost node) is stale: on the same host a pid
that is not alive, or alive but started after the lock was written (a reused pid), and it is taken over with a
warning; a lock of another host cannot be checked from here, so the error names it and says how to remove it.
Only training takes the lock: --predict, --eval and --export read checkpoints without it (modelpath/checkpoints.py
and execution/mesh_session.py take the newest complete one and cope with one rotated away while they open it).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Optional

from schema import ConfigError

LOCK = ".trainer.lock"
# A lock file still empty or half-written after this long was left by a process that died while writing it.
_WRITE_GRACE_S = 30.0


class LockedError(ConfigError):
    """Another trainer holds the model_path (one line, printed by main.py as `error: ...`)."""


def _host() -> str:
    return socket.gethostname()


def _pid_start_time(pid: int) -> Optional[float]:
    """When process `pid` started (seconds since the epoch), from /proc; None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _alive(pid: int, started: Optional[float]) -> bool:
    """Whether the process that wrote a lock at `started` is still running on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists (another user's process)
    begun = _pid_start_time(pid)
    if begun is not None and started is not None and begun > started + 2.0:
        return False  # that pid now belongs to a process started after the lock was written
    return True


def read(model_path: str) -> Optional[dict]:
    """The lock's holder ({"host", "pid", "started", ...}), {} for a lock file that cannot be read as one, None
    without a lock."""
    try:
        with open(os.path.join(model_path, LOCK)) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(text)
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) and isinstance(holder.get("pid"), int) else {}


def describe(holder: dict) -> str:
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {holder.get('pid')} on host {holder.get('host')}, started {when}"


def check_free(model_path: str) -> None:
    """Raises LockedError when a trainer that may still be running holds model_path's lock (what TrainerLock
    refuses), without taking the lock or removing a stale one: main.py asks this before --new deletes anything."""
    holder = read(model_path)
    if holder is not None:
        TrainerLock(model_path).why_stale(holder)


class TrainerLock:
    """`with TrainerLock(model_path):` holds model_path's lock while training; a LockedError when another live
    trainer holds it."""

    def __init__(self, model_path: str, say=None):
        self.model_path = model_path
        self.path = os.path.join(model_path, LOCK)
        self._say = say or (lambda line: print(f"warning: {line}", file=sys.stderr, flush=True))
        self._held = False
        self._made = []  # the folders acquire made (model_path and missing parents), deepest first

    def acquire(self) -> None:
        if "://" in self.model_path:
            return  # a bucket has no atomic create: one trainer per model_path is up to the user there
        missing = os.path.abspath(self.model_path)
        while not os.path.lexists(missing) and os.path.dirname(missing) != missing:
            self._made.append(missing)
            missing = os.path.dirname(missing)
        os.makedirs(self.model_path, exist_ok=True)
        me = {"host": _host(), "pid": os.getpid(), "started": time.time(), "argv": sys.argv[1:]}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self._held = True
            return
        raise LockedError(f"could not take the lock {self.path}: another trainer keeps taking it")

    def _take_over_if_stale(self) -> None:
        """Removes a stale lock (saying so), or raises LockedError naming its live holder."""
        holder = read(self.model_path)
        if holder is None:
            return  # removed meanwhile: try again
        why = self.why_stale(holder)
        if why is None:
            return  # removed meanwhile: try again
        if read(self.model_path) != holder:
            return  # another trainer took it over first: look again
        try:
            os.remove(self.path)
        except FileNotFoundError:
            return
        self._say(f"took over the lock of {self.model_path} ({why})")

    def why_stale(self, holder: dict) -> Optional[str]:
        """Why the lock held by `holder` (as `read` returns it) is stale, None if it is gone; raises LockedError
        naming its holder when that trainer may still be running."""
        if not holder:
            try:
                age = time.time() - os.stat(self.path).st_mtime
            except FileNotFoundError:
                return None
            if age < _WRITE_GRACE_S:  # being written by a trainer starting right now
                raise LockedError(f"{self.model_path} is being locked by another trainer just starting ({self.path}): "
                                  f"one trainer per model_path; use another model_path, or wait for it to finish")
            why = "a damaged lock file"
        elif holder.get("host") == _host():
            if _alive(holder["pid"], holder.get("started")):
                raise LockedError(
                    f"{self.model_path} is being trained by {describe(holder)} (lock {self.path}): one trainer per "
                    f"model_path; stop that one first, or use another model_path")
            why = f"left by {describe(holder)}, which is no longer running"
        else:
            raise LockedError(
                f"{self.model_path} is being trained by {describe(holder)} (lock {self.path}): one trainer per "
                f"model_path; stop that one first, or, if it is no longer running, delete {self.path}")
        return why

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        holder = read(self.model_path)
        if holder and holder.get("pid") == os.getpid() and holder.get("host") == _host():
            try:
                os.remove(self.path)
            except OSError:
                pass  # left behind, it is found stale by the next trainer on this host
        for folder in self._made:  # a job refused before writing anything (its data, say): no empty folders left
            try:
                os.rmdir(folder)
            except OSError:
                break  # not empty: the job wrote into it
        self._made = []

    def __enter__(self) -> "TrainerLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
