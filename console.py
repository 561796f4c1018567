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

The command lines' parser (`ArgumentParser`) is here too: its errors are console lines in the project's form.
"""
from __future__ import annotations

import argparse
import atexit
import math
import os
import platform
import subprocess
import sys

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
    # oneDNN on a CPU without AVX-512 (runtime_defaults turns it on there) runs boolean ops on Eigen, and says so
    r"|oneDNN supports DT_BOOL only on platforms with AVX-512\. Falling back to the default Eigen-based)",
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


CUDA_CACHE_BYTES = 4 << 30  # the CUDA JIT cache: TensorFlow's kernels JIT-compiled from PTX, kept for later runs


def runtime_defaults(environ=os.environ, tpu_device_files: int | None = None, system: str | None = None,
                     machine: str | None = None) -> None:
    """Environment defaults TensorFlow and the accelerator runtimes read when TensorFlow loads (a value the user
    set is kept):
    * TF_ENABLE_ONEDNN_OPTS=1 on x86-64 Linux: TensorFlow's CPU matmuls through oneDNN. TensorFlow turns it on by
      itself only on CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX (tensorflow/core/util/util.cc,
      IsMKLEnabled); elsewhere (AVX2 CPUs: most AMD EPYC and older Xeon VMs, laptops) its fp32 matmuls take
      Eigen's kernels, which ran this model's products with 2048- and 8192-column outputs at 40-70% of the rate
      oneDNN reaches, and training 1.3x slower (2-core AMD EPYC, AVX2; docs/measured.md, "What each change gave").
    * CUDA_CACHE_MAXSIZE: on a GPU whose compute capability this TensorFlow build has no SASS for (e.g. an H100
      with TF's compute_90 PTX), the driver JIT-compiles TF's kernels at start, for minutes; CUDA's default
      256 MiB cache cannot keep them, and every new process would compile again.
    * TPU_SKIP_MDS_QUERY=1 on a machine without TPU device files: libtpu (loaded by tensorflow-tpu) otherwise
      asks the Google Cloud metadata server for the TPU's topology, 30 tries per value, before the import ends."""
    system = system if system is not None else sys.platform
    machine = machine if machine is not None else platform.machine()
    if system.startswith("linux") and machine in ("x86_64", "AMD64"):
        environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    environ.setdefault("CUDA_CACHE_MAXSIZE", str(CUDA_CACHE_BYTES))
    if tpu_device_files is None:
        import glob
        tpu_device_files = len(glob.glob("/dev/accel*")) + len(glob.glob("/dev/vfio/[0-9]*"))
    if not tpu_device_files:
        environ.setdefault("TPU_SKIP_MDS_QUERY", "1")


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


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with its own errors (a mistyped flag, a value of the wrong type, a missing required
    flag) in the project's form: one `error:` line that names the fix, exit status 2. argparse's default
    prints the whole usage block and `PROG: error: ...` instead."""

    def error(self, message: str):
        command = self.prog if self.prog.startswith("python") else f"python {self.prog}"
        self.exit(2, f"error: {message}: fix the command line (`{command} --help` lists the flags)\n")


def whole_number(minimum: int):
    """An argparse type: a whole number >= minimum, with a message that says so."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    parse.__name__ = f"whole number >= {minimum}"
    return parse


def number_above(bound: float, inclusive: bool = False):
    """An argparse type: a finite number more than `bound` (at least it, inclusive). float() reads "nan" and
    "inf" too: `--peak_tflops -5` printed MFU -0.4%, and no comparison refuses NaN."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"takes a finite number, got {text!r}")
        if value < bound or (value == bound and not inclusive):
            raise argparse.ArgumentTypeError(f"must be {'at least' if inclusive else 'more than'} {bound:g}, got "
                                             f"{value:g}")
        return value
    parse.__name__ = f"number {'>=' if inclusive else '>'} {bound:g}"
    return parse
