"""The watch on a cluster's other tasks (devices/task_watch.py) on real loopback sockets: a task that answered and
then stopped is reported once, one never reached is not judged, a silence short of the unreachable time is not
judged, and a stopped watch judges nothing. The chief's end when a worker is killed mid-training, and a worker's
when its chief is, are in test_cluster.py."""
import socket
import time

from devices import cluster as cluster_lib
from devices import task_watch
from devices.task_watch import TaskWatch, missed


def listening():
    """A loopback socket listening on a free port, and its "host:port"."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    return server, f"127.0.0.1:{server.getsockname()[1]}"


def unused_address():
    """A loopback address nothing listens on (its port bound, then let go)."""
    server, address = listening()
    server.close()
    return address


def reports(tasks, act, rounds=8, **options):
    """The watch's calls to on_gone, `rounds` rounds after `act()` (done once the watch has run two rounds)."""
    calls, interval = [], 0.05
    watch = TaskWatch(tasks, lambda *call: calls.append(call), interval_s=interval, misses=3,
                        connect_timeout_s=1, **options).start()
    time.sleep(2.5 * interval)
    act(watch)
    time.sleep(rounds * interval)
    watch.stop()
    return calls


def test_a_connection_is_made_to_a_listening_port_and_refused_by_a_closed_one():
    server, address = listening()
    assert missed(address) is None
    server.close()
    assert missed(address) == "connection refused"


def test_a_worker_that_answered_and_stopped_is_reported_once_with_the_reason():
    server, address = listening()
    calls = reports({1: address, 2: listening()[1]}, lambda watch: server.close())
    assert calls == [(1, address, "connection refused")]


def test_a_worker_never_seen_is_not_judged_since_tasks_start_in_any_order():
    calls = reports({1: unused_address()}, lambda watch: None)
    assert calls == []


def test_a_stopped_watch_judges_nothing():
    server, address = listening()

    def stop_then_close(watch):
        watch.stop()
        server.close()

    assert reports({1: address}, stop_then_close) == []


def test_the_chief_stops_its_watch_before_it_releases_the_workers(monkeypatch):
    """Released workers end; a watch still running would take that for a failure."""
    events = []

    class Watch:
        def stop(self):
            events.append("stop")

    monkeypatch.setattr(cluster_lib, "release_workers", lambda cluster, server: events.append("release"))
    monkeypatch.setattr(cluster_lib, "_held", [("cluster", "server", Watch())])
    assert cluster_lib.release_held_workers() is True
    assert events == ["stop", "release"]


def test_a_worker_that_does_not_answer_is_judged_only_after_the_unreachable_time(monkeypatch):
    """A timeout (or a name that does not resolve) may pass, unlike a refused connection: a short silence is
    not judged, a long one is. Bug caught: every reason judged after `misses` rounds (a network blip of three
    seconds would end a long run)."""
    address = "10.0.0.2:2222"  # never connected to: the connections' outcomes are the test's
    answer = {"now": None}
    monkeypatch.setattr(task_watch, "missed", lambda address, timeout: answer["now"])

    def go_silent(watch):
        answer["now"] = "timed out"

    assert reports({1: address}, go_silent, unreachable_s=5) == []  # 8 rounds: 0.4 s of silence
    answer["now"] = None
    assert reports({1: address}, go_silent, rounds=30, unreachable_s=0.5) == [(1, address, "timed out")]
