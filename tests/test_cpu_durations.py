"""tests/cpu_durations.py (`pytest --cpu-durations=N`): tests ranked by CPU seconds, not wall time, with each
file's total. Run on a throwaway test file in a pytest process of its own (no TensorFlow: about a second)."""
import os
import re
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))

SAMPLE = '''
import time

def test_busy():
    end = time.process_time() + 0.4
    while time.process_time() < end:
        pass

def test_idle():
    time.sleep(0.4)
'''


def test_tests_are_ranked_by_cpu_seconds_and_files_totalled(tmp_path):
    """A test that computes for 0.4 s comes first with about 0.4 CPU seconds; one that sleeps 0.4 s costs almost
    none (its wall time would rank it beside the other); the file's total is the two added.
    Bug caught: the figure taken from the wall clock (`time.perf_counter`) in place of getrusage."""
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "cpu_durations", "--cpu-durations=0",
                           "-p", "no:cacheprovider", "-q", "test_sample.py"], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": TESTS}, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = re.findall(r"^\s+([\d.]+)  (\S+)$", done.stdout, re.M)
    tests = [(name, float(seconds)) for seconds, name in rows if "::" in name]
    files = {name: float(seconds) for seconds, name in rows if "::" not in name}
    assert [name for name, _ in tests] == ["test_sample.py::test_busy", "test_sample.py::test_idle"]
    assert tests[0][1] >= 0.3 and tests[1][1] < 0.15, tests
    assert abs(files["test_sample.py"] - (tests[0][1] + tests[1][1])) < 0.15
