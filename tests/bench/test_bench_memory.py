"""bench/bench_memory.py's watch: a worker past the memory budget is stopped, one within it reports its result."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
import bench_train  # noqa: E402


def test_a_run_over_the_memory_budget_is_stopped_and_one_within_it_reports_its_result():
    """The bug it guards: the memory bench's watch not stopping a worker that passes the budget (the machine
    would swap or the kernel kill something else)."""
    import bench_memory
    hog = [sys.executable, "-c", "import time; b = b'x' * (400 << 20); time.sleep(30)"]
    result, highest, status = bench_memory.run_watched(hog, budget=200 << 20, interval=0.02)
    assert (result, status) == (None, "over budget") and highest > 200 << 20
    fine = [sys.executable, "-c", f"print({bench_train.MARK!r} + '{{\"tokens_per_s\": 5}}')"]
    assert bench_memory.run_watched(fine, budget=200 << 20) == ({"tokens_per_s": 5}, pytest.approx(0, abs=200 << 20),
                                                                 "ok")
