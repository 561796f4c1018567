"""console/environment.py: the runtimes' environment defaults every entry point sets before TensorFlow loads."""
import os
import sys

import pytest


def test_runtime_defaults_keep_what_the_user_set():
    from console.environment import CUDA_CACHE_BYTES, runtime_defaults
    environ = {}
    runtime_defaults(environ, tpu_device_files=0, system="linux", machine="x86_64")
    assert environ == {"TF_ENABLE_ONEDNN_OPTS": "1", "CUDA_CACHE_MAXSIZE": str(CUDA_CACHE_BYTES),
                       "TPU_SKIP_MDS_QUERY": "1"}
    environ = {"CUDA_CACHE_MAXSIZE": "1000", "TF_ENABLE_ONEDNN_OPTS": "0"}
    runtime_defaults(environ, tpu_device_files=4, system="linux", machine="x86_64")  # a TPU VM: libtpu must ask
    assert environ == {"CUDA_CACHE_MAXSIZE": "1000", "TF_ENABLE_ONEDNN_OPTS": "0"}


def test_onednn_is_asked_for_on_x86_linux_only():
    """TensorFlow's oneDNN matmuls are turned on where its own default leaves them off (x86-64 CPUs without
    VNNI/AMX); ARM builds and other systems keep TensorFlow's choice."""
    from console.environment import runtime_defaults
    for system, machine, expected in [("linux", "x86_64", "1"), ("linux", "aarch64", None), ("darwin", "x86_64", None),
                                      ("win32", "AMD64", None)]:
        environ = {}
        runtime_defaults(environ, tpu_device_files=0, system=system, machine=machine)
        assert environ.get("TF_ENABLE_ONEDNN_OPTS") == expected, (system, machine)


def test_onednn_is_on_in_processes_set_up_like_the_entry_points():
    """The variable is read once, when TensorFlow loads: conftest sets the defaults as main.py does, before that,
    so this process (and every test's) runs TensorFlow's oneDNN kernels on x86-64 Linux."""
    import platform
    if not (sys.platform.startswith("linux") and platform.machine() == "x86_64"):
        pytest.skip("oneDNN is asked for on x86-64 Linux only")
    if os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1") != "1":
        pytest.skip(f"TF_ENABLE_ONEDNN_OPTS={os.environ['TF_ENABLE_ONEDNN_OPTS']} was set outside the tests")
    from tensorflow.python.util import _pywrap_util_port
    assert _pywrap_util_port.IsMklEnabled()
