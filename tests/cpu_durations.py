"""`pytest --cpu-durations=N`: the N tests that cost the most CPU seconds, and the cost of each file.

pytest's own `--durations` reports wall time, which on a shared 2-core machine is 3 to 8 times a test's CPU time
and changes from run to run; the `slow` mark and the suite's file order (conftest.FIRST_FILES) are judged by CPU
seconds. A test's figure is the user + system time of its process and of the processes it waited for, from its
setup to its teardown, so a module or session fixture counts once, in the first test that uses it. Under
pytest-xdist each worker measures its own tests and the controller prints the report.
"""
import collections
import resource

import pytest

_collected = {}  # node id -> CPU seconds, in the process that prints the summary


def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N",
                     help="list the N tests with the most CPU seconds (0: all) and every file's total")


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if item.config.getoption("cpu_durations") is None or call.when != "teardown":
        return
    # the teardown report's user_properties travel to xdist's controller, which prints the summary
    report = outcome.get_result()
    report.user_properties.append(("cpu_seconds", _cpu_seconds() - item._cpu_start))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item._cpu_start = _cpu_seconds()


def pytest_runtest_logreport(report):
    for name, value in report.user_properties:
        if name == "cpu_seconds":
            _collected[report.nodeid] = value


def pytest_terminal_summary(terminalreporter, config):
    count = config.getoption("cpu_durations")
    if count is None or not _collected:
        return
    tests = sorted(_collected.items(), key=lambda kv: -kv[1])
    files = collections.Counter()
    for nodeid, seconds in tests:
        files[nodeid.split("::")[0]] += seconds
    write = terminalreporter.write_line
    terminalreporter.section(f"CPU seconds: {sum(files.values()):.0f} in {len(tests)} tests")
    for nodeid, seconds in tests[:count or len(tests)]:
        write(f"{seconds:8.1f}  {nodeid}")
    terminalreporter.section("CPU seconds per file")
    for path, seconds in files.most_common():
        write(f"{seconds:8.1f}  {path}")
