"""--tpu local|colab|NAME|grpc://: which TPU is meant and the one line on what is missing, decided from gathered
facts (devices/tpu_access.py), and main.py's answer on this machine, which has no TPU: one error line each, in
bounded time, no traceback."""
import socket
import time

import pytest

import main
from devices import tpu_access
from devices.errors import DeviceError
from devices.tpu_access import Target, TpuFacts, target, tpu_problem

TPU_VM = TpuFacts(tensorflow="tensorflow-tpu", tensorflow_version="2.20.0", libtpu="0.0.52", tpu_device_files=4,
                  accelerator_type="v4-8")


def test_targets_and_their_jobs():
    assert target("local") == Target("local", "local", "localhost", "local")
    assert target("grpc://10.0.0.2:8470") == Target("grpc", "grpc://10.0.0.2:8470", "worker", "grpc://10.0.0.2:8470")
    assert target("my-tpu") == Target("name", "my-tpu", "worker", "my-tpu")
    # Colab: its TPU Node where COLAB_TPU_ADDR names one, else the runtime's own TPU (Colab's TPU VMs)
    assert target("colab", "10.1.2.3:8470") == Target("grpc", "grpc://10.1.2.3:8470", "worker", "colab")
    assert target("colab", None) == Target("local", "local", "localhost", "colab")
    for bad in ("", "grpc://10.0.0.2", "grpc://:8470", "http://x:1", "a/b"):
        with pytest.raises(DeviceError, match="--tpu"):
            target(bad)


def test_local_needs_the_tpu_build_libtpu_and_a_tpu():
    local = target("local")
    assert tpu_problem(local, TPU_VM) is None
    plain = TpuFacts(tensorflow="tensorflow", tensorflow_version="2.21.0", tpu_device_files=4)
    assert "TensorFlow's TPU build" in tpu_problem(local, plain) and tpu_access.INSTALL in tpu_problem(local, plain)
    no_libtpu = TpuFacts(tensorflow="tensorflow-tpu", tensorflow_version="2.20.0", tpu_device_files=4)
    assert "libtpu" in tpu_problem(local, no_libtpu) and tpu_access.INSTALL in tpu_problem(local, no_libtpu)
    no_tpu = TpuFacts(tensorflow="tensorflow-tpu", libtpu="0.0.52")
    assert "has no TPU" in tpu_problem(target("colab"), no_tpu) and "--tpu colab" in tpu_problem(target("colab"), no_tpu)


@pytest.mark.parametrize("accelerator, refused", [("v2-8", False), ("v3-32", False), ("v4-8", False), (None, False),
                                                  ("v5litepod-8", True), ("v5p-8", True), ("v6e-4", True)])
def test_only_stream_executor_generations_run_session_programs(accelerator, refused):
    facts = TpuFacts(**{**TPU_VM.__dict__, "accelerator_type": accelerator})
    problem = tpu_problem(target("local"), facts)
    assert (problem is not None) == refused
    if refused:
        assert "PJRT" in problem and "v2, v3 or v4" in problem


def test_a_node_address_must_answer_and_a_name_needs_the_resolver_and_the_metadata_server():
    node = target("grpc://10.0.0.2:8470")
    assert tpu_problem(node, TpuFacts(address_answers=True)) is None
    assert "nothing answered there within 7 s" in tpu_problem(node, TpuFacts(address_answers=False), 7)
    name = target("my-tpu")
    missing = tpu_problem(name, TpuFacts(resolver_packages=("googleapiclient",)))
    assert "googleapiclient" in missing and tpu_access.INSTALL in missing
    assert "metadata server" in tpu_problem(name, TpuFacts(metadata_answers=False))
    assert tpu_problem(name, TpuFacts(metadata_answers=True)) is None


def test_answers_is_bounded_and_tells_a_listener_from_none():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    assert tpu_access.answers("127.0.0.1", port, 2.0)
    listener.close()  # the port is free now: nothing listens there
    start = time.monotonic()
    assert not tpu_access.answers("127.0.0.1", port, 2.0)
    assert time.monotonic() - start < 3.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("tpu", ["local", "colab", "my-tpu", "grpc://127.0.0.1:{port}"])
def test_main_gives_one_error_line_for_each_tpu_on_a_machine_without_one(tpu, capsys, monkeypatch):
    monkeypatch.delenv("COLAB_TPU_ADDR", raising=False)
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1")  # a name's lookup: nothing answers on port 80 here
    monkeypatch.setattr(tpu_access, "_tpu_device_files", lambda: 0)
    start = time.monotonic()
    assert main.main(["--tpu", tpu.format(port=_free_port()), "--tpu_timeout", "2"]) == 1
    assert time.monotonic() - start < 20
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --tpu "), err
