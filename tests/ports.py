"""Loopback ports for the tests that start TensorFlow servers (multi-host runs, launchers, preemption).

A port found free by binding port 0 is one the kernel may hand out again at once, as the local end of any
outgoing connection, and under `pytest -n 2` the other worker's tests pick the same way: a server could then
meet another test's server on "its" port. These come from a range below the kernel's ephemeral range
(/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default), a range of its own for each pytest-xdist
worker, and are checked free by binding them.
"""
import os
import random
import socket

import pytest

FIRST, PER_WORKER = 20000, 2000


def loopback_ports(n: int) -> list:
    """`n` consecutive free loopback ports (SLURM's layout puts a node's tasks on consecutive ports) from this
    worker's own range."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    low = FIRST + PER_WORKER * (int(worker) if worker.isdigit() else 0)
    draw = random.Random()
    for _ in range(200):
        start = draw.randrange(low, low + PER_WORKER - n)
        sockets = [socket.socket() for _ in range(n)]
        try:
            for offset, s in enumerate(sockets):
                s.bind(("127.0.0.1", start + offset))
            return list(range(start, start + n))
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    pytest.skip(f"no {n} consecutive free ports on loopback in {low}-{low + PER_WORKER}")
