"""bench/bench_startup.py's timed run: the first result line's time and the lines before it."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))


def test_startup_bench_times_the_first_result_line_and_the_lines_before_it():
    """bench_startup's timed_run: the first line matching the job's pattern is the first result; lines before it
    are kept, with the longest silence among them."""
    import bench_startup
    code = "import time; print('loading ...'); time.sleep(0.3); print('======== sample 0'); print('after')"
    r = bench_startup.timed_run([sys.executable, "-c", code], bench_startup.FIRST_RESULT["predict"])
    assert r["returncode"] == 0 and r["first_s"] >= 0.3 and r["first_cpu_s"] is not None
    assert [line for _, line in r["lines_before"]] == ["loading ..."]
    assert r["longest_silence_s"] >= 0.3
