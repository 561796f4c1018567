"""The environment TensorFlow and the accelerator runtimes read when TensorFlow loads: every entry point sets
it before importing TensorFlow (console/stderr_filter.quiet_tensorflow calls `runtime_defaults`; the tests'
conftest.py calls it itself)."""
from __future__ import annotations

import hashlib
import os
import platform
import sys
import time

CUDA_CACHE_BYTES = 4 << 30  # the CUDA JIT cache: TensorFlow's kernels JIT-compiled from PTX, kept for later runs
XLA_CACHE_VARIABLE = "GPT_NEO_XLA_CACHE"  # "off" (or 0, no, false, empty): no XLA compile cache; else its folder
XLA_CACHE_FLAG = "--tf_xla_persistent_cache_directory"
XLA_CACHE_FOLDER = "gpt-neo/xla"  # under $XDG_CACHE_HOME or ~/.cache
OFF_WORDS = ("", "0", "off", "no", "false")  # what turns a GPT_NEO_* switch off (case and spaces aside)


def switched_off(setting: str | None) -> bool:
    """Whether an environment setting (None: not set) says off."""
    return setting is not None and setting.strip().lower() in OFF_WORDS


def cache_root(variable: str, folder: str, environ=os.environ) -> str | None:
    """A cache's folder: the environment variable `variable` names it (None when it says off), else `folder`
    under $XDG_CACHE_HOME or ~/.cache."""
    setting = environ.get(variable)
    if switched_off(setting):
        return None
    if setting is not None:
        return os.path.expanduser(setting)
    home = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(home, folder)


def xla_cache_in_use(environ=os.environ) -> str | None:
    """The XLA compile cache's folder TF_XLA_FLAGS names (`runtime_defaults` puts it there), if any."""
    for flag in environ.get("TF_XLA_FLAGS", "").split():
        if flag.startswith(XLA_CACHE_FLAG + "="):
            return flag.split("=", 1)[1] or None
    return None


def runtime_defaults(environ=os.environ, tpu_device_files: int | None = None, system: str | None = None,
                     machine: str | None = None, tf_version: str | None = None, cpu_flags: str | None = None,
                     gpus: str | None = None) -> None:
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
      asks the Google Cloud metadata server for the TPU's topology, 30 tries per value, before the import ends.
    * TF_XLA_FLAGS gets --tf_xla_persistent_cache_directory (`xla_cache_directory`; the user's other flags are
      kept, and a directory the user named is not replaced): XLA's compiled kernels are kept on disk, and a later
      process loads them instead of compiling again (docs/speed.md: a tiny model's training on a 2x2 mesh
      took 6-14 CPU s fewer, its selfcheck 6).
    `tf_version`, `cpu_flags`, `gpus`: what keys the XLA cache's folder (read from the installed TensorFlow's
    metadata, /proc/cpuinfo and NVIDIA's driver files when not given)."""
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
    xla_flags = environ.get("TF_XLA_FLAGS", "")
    if XLA_CACHE_FLAG not in xla_flags:
        directory = xla_cache_directory(environ, machine, tf_version, cpu_flags, gpus)
        if directory is not None:
            environ["TF_XLA_FLAGS"] = " ".join(filter(None, [xla_flags, f"{XLA_CACHE_FLAG}={directory}"]))


def xla_cache_directory(environ, machine: str, tf_version: str | None = None, cpu_flags: str | None = None,
                        gpus: str | None = None):
    """The folder XLA's compiled kernels are kept in, made if missing; None when GPT_NEO_XLA_CACHE turns the
    cache off or the folder cannot be written (then one line says so: the job runs without a cache, since
    TensorFlow fails a compile whose result it cannot write).

    The folder is $GPT_NEO_XLA_CACHE or $XDG_CACHE_HOME/gpt-neo/xla (~/.cache/...), then a subfolder
    `xla_cache_key` names: an executable is machine code for the CPU (or GPU) it was compiled on (AVX-512 code
    would crash an AVX2 machine sharing the home directory, an A100's kernels an older GPU) by one TensorFlow's
    XLA, and TensorFlow's own key (the cluster's signature and HLO) knows neither. Entries a killed process or a full disk left broken are removed
    first (`drop_broken_entries`): TensorFlow fails the job on one it cannot read."""
    root = cache_root(XLA_CACHE_VARIABLE, XLA_CACHE_FOLDER, environ)
    if root is None:
        return None
    if tf_version is None:
        tf_version = installed_tensorflow_version()
    if cpu_flags is None:
        cpu_flags = host_cpu_flags()
    if gpus is None:
        gpus = host_gpu_models()
    directory = os.path.join(root, xla_cache_key(tf_version, machine, cpu_flags, environ.get("XLA_FLAGS", ""), gpus))
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".probe-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        print(f"note: no XLA compile cache in this run: cannot write {directory} ({e.strerror or e}); set "
              f"{XLA_CACHE_VARIABLE} to a writable folder, or to off", file=sys.stderr)
        return None
    drop_broken_entries(directory)
    return directory


def xla_cache_key(tf_version: str, machine: str, cpu_flags: str, xla_flags: str = "", gpus: str = "") -> str:
    """The XLA cache's subfolder for compiled code valid here: TensorFlow's version, the machine's architecture and
    a hash of the CPU's feature flags (the instructions XLA compiled for), the GPUs' models (the architecture
    XLA:GPU compiled for) and XLA_FLAGS (which change the code XLA emits for the same program)."""
    digest = hashlib.sha256(f"{' '.join(sorted(cpu_flags.split()))}\n{xla_flags}\n{gpus}".encode()).hexdigest()[:16]
    return f"tf{tf_version}-{machine}-{digest}"


def installed_tensorflow_version() -> str:
    """The installed TensorFlow's version, from its package metadata (importing TensorFlow would start it before
    its environment is set)."""
    from importlib import metadata
    for name in ("tensorflow", "tensorflow-cpu", "tensorflow-tpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def host_gpu_models(information_files: str = "/proc/driver/nvidia/gpus/*/information") -> str:
    """This host's NVIDIA GPUs' models, sorted ("" without NVIDIA's driver), read from the driver's files under
    /proc (asking CUDA would start it before TensorFlow's environment is set)."""
    import glob
    models = []
    for path in glob.glob(information_files):
        try:
            with open(path) as f:
                models += [value.strip() for name, _, value in (line.partition(":") for line in f) if name == "Model"]
        except OSError:
            continue
    return ",".join(sorted(models))


def host_cpu_flags() -> str:
    """The CPU's feature flags (x86 `flags`, ARM `Features` in /proc/cpuinfo; elsewhere what `platform` tells)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() in ("flags", "Features"):
                    return value.strip()
    except OSError:
        pass
    return f"{platform.processor()} {platform.platform()}"


def drop_broken_entries(directory: str, tmp_age_s: float = 3600) -> None:
    """Removes cache entries (XlaSerializedCacheEntry protos, *.pb) that are not whole: TensorFlow fails the job on
    a truncated one ("OUT_OF_RANGE: Read less bytes than requested") and on one without its executable, in every
    later run. TensorFlow writes each entry to a .tmp file and renames it, so a broken entry is a damaged disk or
    an older writer's; a .tmp left by a killed process is removed after an hour."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    now = time.time()
    for name in names:
        path = os.path.join(directory, name)
        try:
            broken = name.endswith(".pb") and not _whole_cache_entry(path)
            if broken or (name.endswith(".tmp") and now - os.path.getmtime(path) > tmp_age_s):
                os.remove(path)
        except OSError:  # another process removed or replaced it
            continue


def _whole_cache_entry(path: str) -> bool:
    """Whether the file is a complete protobuf message holding a non-empty field 3 (XlaSerializedCacheEntry's
    executable): walks its top-level fields, reading only their tags and lengths."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        executable = False
        while f.tell() < size:
            tag = _varint(f)
            if tag is None:
                return False
            field, wire_type = tag >> 3, tag & 7
            if wire_type == 0:
                if _varint(f) is None:
                    return False
            elif wire_type in (1, 5):
                f.seek(8 if wire_type == 1 else 4, os.SEEK_CUR)
            elif wire_type == 2:
                length = _varint(f)
                if length is None:
                    return False
                executable |= field == 3 and length > 0
                f.seek(length, os.SEEK_CUR)
            else:
                return False
        return f.tell() == size and executable


def _varint(f) -> int | None:
    value = shift = 0
    while shift < 64:
        byte = f.read(1)
        if not byte:
            return None
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
    return None
