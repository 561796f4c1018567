"""The environment TensorFlow and the accelerator runtimes read when TensorFlow loads: every entry point sets
it before importing TensorFlow (console/stderr_filter.quiet_tensorflow calls `runtime_defaults`; the tests'
conftest.py calls it itself)."""
from __future__ import annotations

import os
import platform
import sys

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
