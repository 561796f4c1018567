"""Keeps TensorFlow's C++ start-up chatter off the console; the project's own lines and real errors pass.

TensorFlow 2.21 logs through absl before anything can configure it, so TF_CPP_MIN_LOG_LEVEL no longer
silences lines such as "All log messages before absl::InitializeLog() is called are written to STDERR",
"Could not find cuda drivers on your machine", the CPU-instructions and oneDNN notices, cuDNN/cuFFT/cuBLAS
"Unable to register ... factory" errors, XLA's "Compiled cluster using XLA!" or "SetPriority unimplemented".
They are written by C++ straight to file descriptor 2, so `quiet_tensorflow()` (called first thing by every
entry point, before TensorFlow is imported) points descriptor 2 at a pipe read by a small filter process that
drops those lines and copies everything else to the real stderr: C++ errors other than the known start-up ones
(FATAL and "Check failed" lines always pass) and what child processes write. Python's own `sys.stderr`
(tracebacks, this project's `error:` lines and warnings, progress bars) is pointed straight at the real
stderr, so it stays in order with stdout. A separate process, not a thread, so that a crash's last words
still arrive after this process is gone.

Set GPT_NEO_TF_LOGS=1 to see TensorFlow's lines unfiltered.
"""
from __future__ import annotations

import atexit
import os
import subprocess
import sys

from console.environment import runtime_defaults

# Lines dropped. C++ INFO and WARNING lines of TensorFlow/XLA/absl (absl's "I1123 12:00:00.123 123 file.cc:45]"
# and TF's older "2026-11-23 12:00:00.123: I file.cc:45]"), and the start-up ERROR lines that are not errors.
# INFO and WARNING lines about CUDA's PTX JIT, ptxas or libdevice pass: they explain a start that takes minutes
# (TF's kernels JIT-compiled for a GPU this build has no SASS for) or an XLA:GPU compile that fails.
_FIRST_RUN = r"(?!.*(PTX|ptxas|libdevice|jit-compil|JIT compil|compute capability))"
CHATTER = (
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    r"^[IW]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\] " + _FIRST_RUN,
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] \S+:\d+\] " + _FIRST_RUN,
    # libtpu (tensorflow-tpu) loaded on a machine without a TPU: it looks for one and says so, harmlessly
    r"^Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type",
    r"^WARNING: Logging before InitGoogle\(\) is written to STDERR",
    r"^E\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ common_lib\.cc:\d+\] INVALID_ARGUMENT: Error: unexpected worker hostname "
    r"'WARNING: could not determine TPU worker hostnames",
    r"^=== Source Location Trace: ===$",
    r"^learning/\S+\.cc:\d+$",
    r"^(E\d{4} \d\d:\d\d:\d+\.\d+\s+\d+|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: E) \S+:\d+\] "
    r"(Unable to register cu(DNN|FFT|BLAS) factory|failed call to cuInit|.*computation placer already registered"
    r"|.*SetPriority unimplemented"
    # oneDNN on a CPU without AVX-512 (runtime_defaults turns it on there) runs boolean and (emulated) bf16 ops
    # on Eigen, and says so
    r"|oneDNN supports DT_(BOOL|BFLOAT16) only on platforms with AVX-512\. Falling back to the default Eigen-based"
    # XLA's compile cache (console/environment.py) reads each entry as a text proto first, then as the binary
    # one it is: every entry loaded says so
    r"|Error parsing text-format tensorflow\.XlaSerializedCacheEntry: "
    # ... and on CPUs where LLVM compiles with tuning hints (AMD Zen 4: +prefer-no-scatter, +prefer-no-gather) XLA
    # compares those with the host's instruction sets, which never list them, and logs each entry it loads twice,
    # naming SIGILL. Only a missing prefer-* hint is dropped: a missing instruction set (an executable from another
    # CPU) still reaches the console; the cache is kept per CPU kind (console/environment.xla_cache_key) anyway.
    r"|Loading XLA:CPU AOT result\. Target machine feature \+prefer-[a-z-]+ is not +supported on the host machine\.)",
    r"^To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler flags\.",
    r"^oneDNN custom operations are on\.",
)

# The filter process: reads the pipe in chunks, passes through at once what cannot be chatter (so that
# progress bars redrawn with \r stay live), holds back only a partial line that may still become chatter.
_FILTER = r"""
import os, re, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the filter ends at EOF
chatter = re.compile("|".join(%r))
maybe = re.compile(r"^([IWEF]\d|\d{4}-|WARNING: All|WARNING: Logging|To enable|oneDNN|Failed to find|=== Source|learning/)")
out = sys.stdout.buffer
pending = b""
while True:
    chunk = os.read(0, 65536)
    if not chunk:
        break
    pending += chunk
    lines = pending.replace(b"\r", b"\r\n").split(b"\n")  # a \r-redrawn bar line counts as a line
    pending = lines.pop()
    for line in lines:
        text = line.rstrip(b"\r").decode("utf-8", "replace")
        if not chatter.match(text):
            out.write(line if line.endswith(b"\r") else line + b"\n")
    if pending and not maybe.match(pending.decode("utf-8", "replace")):
        out.write(pending)
        pending = b""
    out.flush()
if pending and not chatter.match(pending.decode("utf-8", "replace")):
    out.write(pending)
out.flush()
""" % (CHATTER,)

_installed = None


def quiet_tensorflow() -> None:
    """Filters this process's descriptor 2 (and its children's) from now on; call before importing TensorFlow.
    Also sets TF_CPP_MIN_LOG_LEVEL=2 for the lines TensorFlow still lets that variable govern, and the
    runtimes' environment defaults (`runtime_defaults`: every entry point calls this first)."""
    global _installed
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    runtime_defaults()
    if _installed is not None or os.environ.get("GPT_NEO_TF_LOGS") == "1":
        return
    try:
        real = os.dup(2)
        read, write = os.pipe()
        process = subprocess.Popen([sys.executable, "-S", "-c", _FILTER], stdin=read, stdout=real, stderr=real,
                                   close_fds=True)
    except OSError:  # no descriptor 2, or no way to start the filter: leave stderr as it is
        return
    os.close(read)
    sys.stderr.flush()
    os.dup2(write, 2)
    os.close(write)
    # Python's own stderr writes (tracebacks, `error:` lines, progress bars) go straight to the real stderr, in
    # order with stdout; only what C++ (and child processes) write to descriptor 2 passes the filter.
    sys.stderr = os.fdopen(os.dup(real), "w", buffering=1, encoding=sys.stderr.encoding or "utf-8",
                           errors="backslashreplace")
    _installed = (process, real)
    atexit.register(restore)


def restore() -> None:
    """Points descriptor 2 back at the real stderr and waits for the filter to pass on what it holds. Runs at
    exit; call it before os._exit."""
    global _installed
    if _installed is None:
        return
    process, real = _installed
    _installed = None
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os.dup2(real, 2)  # closes this process's end of the pipe: the filter sees the end once children exit too
    os.close(real)
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:  # a child still holds the pipe; the filter ends with it
        pass
