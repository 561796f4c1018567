"""console/stderr_filter.py: TensorFlow's C++ start-up chatter stays off the console; everything else reaches it."""
import os
import subprocess
import sys

import pytest

from console.stderr_filter import CHATTER

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What TF 2.21 and its CUDA/XLA plug-ins write to descriptor 2 at start-up, as they write it.
CHATTER_LINES = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795451673.747480   12905 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.",
    "I0000 00:00:1795447304.437360    3354 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.",
    "E0000 00:00:1731200000.123456   12345 cuda_dnn.cc:8310] Unable to register cuDNN factory: Attempting to register factory for plugin cuDNN when one has already been registered",
    "E0000 00:00:1731200000.123457   12345 cuda_blas.cc:1418] Unable to register cuBLAS factory: Attempting to register factory for plugin cuBLAS when one has already been registered",
    "2026-11-23 12:00:00.000000: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results.",
    "I0000 00:00:1731200000.2 12345 device_compiler.h:188] Compiled cluster using XLA!  This line is logged at most once for the lifetime of the process.",
    "W0000 00:00:1731200000.3 12345 thread.cc:45] SetPriority unimplemented",
    "E0000 00:00:1795502311.508494   26205 util.cc:131] oneDNN supports DT_BOOL only on platforms with AVX-512. Falling back to the default Eigen-based implementation if present.",
    "E0000 00:00:1795845701.568133   26519 util.cc:131] oneDNN supports DT_BFLOAT16 only on platforms with AVX-512. Falling back to the default Eigen-based implementation if present.",
    # each entry XLA's compile cache loads (read as a text proto first, then as the binary one it is)
    "E0000 00:00:1795884164.559335    2345 text_format.cc:378] Error parsing text-format tensorflow.XlaSerializedCacheEntry: 2:1: Expected identifier, got: 4",
    # ... and, on AMD Zen 4, two per entry for LLVM's tuning hints, which the host's instruction sets never list
    "E0000 00:00:1796409163.552109   15296 cpu_aot_loader.cc:220] Loading XLA:CPU AOT result. Target machine feature +prefer-no-scatter is not  supported on the host machine. Machine type used for XLA:CPU compilation doesn't match the machine type for execution. Compile machine features: [+64bit,+avx512f,+prefer-no-scatter,+prefer-no-gather] vs host machine features: [64bit,avx512f]. This could lead to execution errors such as SIGILL.",
    "E0000 00:00:1796409163.552143   15296 cpu_aot_loader.cc:220] Loading XLA:CPU AOT result. Target machine feature +prefer-no-gather is not  supported on the host machine. Machine type used for XLA:CPU compilation doesn't match the machine type for execution. Compile machine features: [+64bit,+avx512f,+prefer-no-scatter,+prefer-no-gather] vs host machine features: [64bit,avx512f]. This could lead to execution errors such as SIGILL.",
    # tensorflow-tpu's libtpu on a machine without a TPU
    "Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type, please set env var `TPU_ACCELERATOR_TYPE` manually, otherwise libtpu.so may not properly initialize.",
    "WARNING: Logging before InitGoogle() is written to STDERR",
    "E0000 00:00:1795483220.126870   21501 common_lib.cc:530] INVALID_ARGUMENT: Error: unexpected worker hostname 'WARNING: could not determine TPU worker hostnames or IP addresses' from env var TPU_WORKER_HOSTNAMES.",
    "=== Source Location Trace: ===",
    "learning/45eac/tfrc/runtime/libtpu_init_utils.cc:310",
]
# What must reach the console: C++ errors that are not the known start-up ones, fatal ones, and anything else.
KEPT_LINES = [
    "E0000 00:00:1731200000.4 12345 tpu_execute.cc:12] Failed to allocate 4.0 GiB on TPU:0",
    "F0000 00:00:1731200000.5 12345 tensor.cc:101] Check failed: dtype() == expected_dtype (1 vs. 3)",
    # an XLA executable compiled for instructions this CPU lacks (a cache from another machine): it may crash
    "E0000 00:00:1796409163.552109   15296 cpu_aot_loader.cc:220] Loading XLA:CPU AOT result. Target machine feature +avx512f is not  supported on the host machine. Machine type used for XLA:CPU compilation doesn't match the machine type for execution. Compile machine features: [+64bit,+avx2,+avx512f] vs host machine features: [64bit,avx2]. This could lead to execution errors such as SIGILL.",
    "error from a child process",
    # why the first start on a new GPU takes minutes, and why XLA:GPU cannot compile: the user must see these
    "W0000 00:00:1731200000.6 12345 gpu_device.cc:2341] TensorFlow was not built with CUDA kernel binaries compatible with compute capability 9.0. CUDA kernels will be jit-compiled from PTX, which could take 30 minutes or longer.",
    "2026-11-23 12:00:00.000000: W xla/service/gpu/nvptx_compiler.cc:765] The NVIDIA driver's CUDA version is 12.2 which is older than the ptxas CUDA version (12.5.82).",
    "W0000 00:00:1731200000.7 12345 gpu_backend_lib.cc:580] Can't find libdevice directory ${CUDA_DIR}/nvvm/libdevice.",
]

WRITER = r"""
import os, subprocess, sys
sys.path.insert(0, sys.argv[1])
from console.stderr_filter import quiet_tensorflow
quiet_tensorflow()
lines = sys.argv[2:]
for line in lines:                      # as C++ writes: straight to descriptor 2
    os.write(2, (line + "\n").encode())
print("error: one line from Python", file=sys.stderr)
sys.stderr.write("progress 1/2\r")       # a redrawn progress bar, no newline
sys.stderr.write("progress 2/2\n")
child = "import os, sys; print('error from a child process', file=sys.stderr); os.write(2, b'child 1/2\\rchild 2/2\\n')"
subprocess.run([sys.executable, "-c", child])  # a child's stderr is descriptor 2: it passes the filter
print("stdout line")
"""


def run_writer(*lines, env=None):
    result = subprocess.run([sys.executable, "-c", WRITER, REPO, *lines], capture_output=True, timeout=60,
                            env=dict(os.environ, **(env or {})))
    result.stdout, result.stderr = result.stdout.decode(), result.stderr.decode()  # bytes kept \r as it was
    return result


def test_chatter_is_dropped_and_everything_else_passes():
    result = run_writer(*CHATTER_LINES, *(line for line in KEPT_LINES if "child" not in line))
    assert result.returncode == 0
    for line in CHATTER_LINES:
        assert line not in result.stderr
    for line in KEPT_LINES:
        assert line in result.stderr
    assert "error: one line from Python\n" in result.stderr
    assert "progress 1/2\rprogress 2/2\n" in result.stderr
    assert "child 1/2\rchild 2/2\n" in result.stderr
    assert result.stdout == "stdout line\n"


def test_every_chatter_line_matches_a_pattern_and_no_kept_line_does():
    import re
    chatter = re.compile("|".join(CHATTER))
    assert all(chatter.match(line) for line in CHATTER_LINES)
    assert not any(chatter.match(line) for line in KEPT_LINES)


def test_the_filter_can_be_turned_off():
    result = run_writer(CHATTER_LINES[0], env={"GPT_NEO_TF_LOGS": "1"})
    assert CHATTER_LINES[0] in result.stderr


@pytest.mark.slow
def test_main_prints_only_its_own_error_line():
    result = subprocess.run([sys.executable, os.path.join(REPO, "main.py"), "--model", "no_such_config"],
                            capture_output=True, text=True, timeout=300, env={k: v for k, v in os.environ.items()
                                                                              if k != "TF_CPP_MIN_LOG_LEVEL"})
    assert result.returncode == 1
    assert result.stderr.startswith("error: model config 'no_such_config' not found") and \
        result.stderr.count("\n") == 1, result.stderr
    # TensorFlow's import is every job's first wait (seconds): a fresh process says so before it starts
    assert result.stdout == "loading TensorFlow ...\n"
