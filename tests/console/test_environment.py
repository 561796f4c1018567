"""console/environment.py: the runtimes' environment defaults every entry point sets before TensorFlow loads."""
import os
import sys

import pytest


def test_runtime_defaults_keep_what_the_user_set():
    from console.environment import CUDA_CACHE_BYTES, runtime_defaults
    environ = {"GPT_NEO_XLA_CACHE": "off"}  # the XLA cache: the tests below
    runtime_defaults(environ, tpu_device_files=0, system="linux", machine="x86_64")
    assert environ == {"GPT_NEO_XLA_CACHE": "off", "TF_ENABLE_ONEDNN_OPTS": "1",
                       "CUDA_CACHE_MAXSIZE": str(CUDA_CACHE_BYTES), "TPU_SKIP_MDS_QUERY": "1"}
    environ = {"GPT_NEO_XLA_CACHE": "off", "CUDA_CACHE_MAXSIZE": "1000", "TF_ENABLE_ONEDNN_OPTS": "0"}
    runtime_defaults(environ, tpu_device_files=4, system="linux", machine="x86_64")  # a TPU VM: libtpu must ask
    assert environ == {"GPT_NEO_XLA_CACHE": "off", "CUDA_CACHE_MAXSIZE": "1000", "TF_ENABLE_ONEDNN_OPTS": "0"}


def test_onednn_is_asked_for_on_x86_linux_only():
    """TensorFlow's oneDNN matmuls are turned on where its own default leaves them off (x86-64 CPUs without
    VNNI/AMX); ARM builds and other systems keep TensorFlow's choice."""
    from console.environment import runtime_defaults
    for system, machine, expected in [("linux", "x86_64", "1"), ("linux", "aarch64", None), ("darwin", "x86_64", None),
                                      ("win32", "AMD64", None)]:
        environ = {"GPT_NEO_XLA_CACHE": "off"}
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


def xla_cache_of(environ) -> str | None:
    """The folder TF_XLA_FLAGS names for XLA's compile cache, or None."""
    flags = [f for f in environ.get("TF_XLA_FLAGS", "").split() if f.startswith("--tf_xla_persistent_cache_directory=")]
    assert len(flags) <= 1, flags
    return flags[0].split("=", 1)[1] if flags else None


def defaults_with_cache(environ, tf_version="2.21.0", cpu_flags="fpu sse2 avx2 fma", machine="x86_64",
                        gpus="") -> dict:
    from console.environment import runtime_defaults
    runtime_defaults(environ, tpu_device_files=0, system="linux", machine=machine, tf_version=tf_version,
                     cpu_flags=cpu_flags, gpus=gpus)
    return environ


def test_xla_cache_folder_is_keyed_by_tensorflow_and_the_cpu(tmp_path):
    """Compiled XLA kernels are machine code for one CPU kind (or GPU model) from one TensorFlow: a home directory
    shared by an AVX-512 and an AVX2 machine, by hosts with different GPUs, or a TensorFlow upgrade, must not hand
    one the other's executables. Bug caught: the CPU's flags (or TF's version, or the GPUs) left out of
    xla_cache_key: two of these folders are the same."""
    from console.environment import XLA_CACHE_FOLDER
    base = {"tf_version": "2.21.0", "cpu_flags": "fpu sse2 avx2 fma", "machine": "x86_64"}
    variants = [base, {**base, "tf_version": "2.22.0"}, {**base, "cpu_flags": "fpu sse2 avx2 fma avx512f"},
                {**base, "machine": "aarch64"}, {**base, "gpus": "NVIDIA A100-SXM4-40GB"},
                {**base, "gpus": "NVIDIA H100 80GB HBM3"}]
    folders = [xla_cache_of(defaults_with_cache({"XDG_CACHE_HOME": str(tmp_path)}, **v)) for v in variants]
    folders.append(xla_cache_of(defaults_with_cache({"XDG_CACHE_HOME": str(tmp_path), "XLA_FLAGS": "--xla_cpu_x"})))
    assert len(set(folders)) == len(folders), folders
    assert all(os.path.dirname(f) == str(tmp_path / XLA_CACHE_FOLDER) and os.path.isdir(f) for f in folders)
    # the flags' order is not part of the key
    again = defaults_with_cache({"XDG_CACHE_HOME": str(tmp_path)}, cpu_flags="fma avx2 sse2 fpu")
    assert xla_cache_of(again) == folders[0]
    # without XDG_CACHE_HOME: ~/.cache
    home = defaults_with_cache({"HOME": str(tmp_path / "home")})
    assert xla_cache_of(home) == str(tmp_path / "home" / ".cache" / XLA_CACHE_FOLDER / os.path.basename(folders[0]))


def test_gpu_models_are_read_from_the_drivers_files(tmp_path):
    """The GPUs in the XLA cache's key come from NVIDIA's driver files, one Model line each, sorted (the order the
    driver lists them in is not part of the key). Bug caught: the Model lines not parsed (every GPU host keyed as
    one without GPUs)."""
    from console.environment import host_gpu_models
    for bus, model in (("0000:02:00.0", "NVIDIA H100 80GB HBM3"), ("0000:01:00.0", "NVIDIA A100-SXM4-40GB")):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(f"Model: \t\t {model}\nIRQ:   \t\t 42\nGPU UUID: \t GPU-1\n")
    assert host_gpu_models(str(tmp_path / "*" / "information")) == "NVIDIA A100-SXM4-40GB,NVIDIA H100 80GB HBM3"
    assert host_gpu_models(str(tmp_path / "none" / "*" / "information")) == ""


def test_xla_cache_keeps_the_users_flags(tmp_path):
    """The user's other TF_XLA_FLAGS stay, and a cache folder the user named is theirs: nothing is added and
    nothing made under the cache home. Bug caught: the flag set with `environ["TF_XLA_FLAGS"] = ...` alone (the
    user's --tf_xla_auto_jit dropped)."""
    environ = defaults_with_cache({"XDG_CACHE_HOME": str(tmp_path), "TF_XLA_FLAGS": "--tf_xla_auto_jit=2"})
    assert environ["TF_XLA_FLAGS"].split()[0] == "--tf_xla_auto_jit=2" and xla_cache_of(environ)
    own = "--tf_xla_auto_jit=2 --tf_xla_persistent_cache_directory=/somewhere/else"
    environ = defaults_with_cache({"XDG_CACHE_HOME": str(tmp_path / "unused"), "TF_XLA_FLAGS": own})
    assert environ["TF_XLA_FLAGS"] == own and not (tmp_path / "unused").exists()


def test_xla_cache_variable_turns_it_off_or_moves_it(tmp_path):
    """GPT_NEO_XLA_CACHE=off: no cache (and nothing made on disk); a path: the cache under it, still keyed. Bug
    caught: the variable not read (the cache in ~/.cache whatever it says)."""
    for off in ("off", "0", ""):
        environ = defaults_with_cache({"XDG_CACHE_HOME": str(tmp_path / "home"), "GPT_NEO_XLA_CACHE": off})
        assert "TF_XLA_FLAGS" not in environ and not (tmp_path / "home").exists(), off
    environ = defaults_with_cache({"XDG_CACHE_HOME": str(tmp_path / "home"), "GPT_NEO_XLA_CACHE": str(tmp_path / "x")})
    folder = xla_cache_of(environ)
    assert os.path.dirname(folder) == str(tmp_path / "x") and os.path.isdir(folder)
    assert not (tmp_path / "home").exists()


def test_unwritable_xla_cache_runs_without_one(tmp_path, capsys):
    """A cache home that cannot be written (read-only home, a file in the way): the job runs without a cache and
    one line says why; TensorFlow would fail every compile whose result it cannot write. Bug caught: the makedirs
    and write probe outside the try (an OSError ends the entry point before it starts)."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    environ = defaults_with_cache({"XDG_CACHE_HOME": str(blocker)})
    assert "TF_XLA_FLAGS" not in environ
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "no XLA compile cache" in lines[0] and "GPT_NEO_XLA_CACHE" in lines[0], lines


def entry_bytes(*fields: tuple[int, bytes]) -> bytes:
    """A protobuf message of length-delimited fields, as XlaSerializedCacheEntry's key (1), hlo_module (2) and
    executable (3) are written."""
    def varint(n):
        out = b""
        while True:
            out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
            n >>= 7
            if not n:
                return out
    return b"".join(varint(number << 3 | 2) + varint(len(value)) + value for number, value in fields)


def test_broken_xla_cache_entries_are_removed(tmp_path):
    """TensorFlow fails the job on a truncated cache entry ("OUT_OF_RANGE: Read less bytes than requested", in
    every later run too; seen on a 2x2 training with its largest entry cut short) and on one without its
    executable: they are removed before TensorFlow starts; whole entries stay, and so does a .tmp another process
    is writing now. Bug caught: the walk not checking that the last field ends at the file's end (a truncated
    entry kept)."""
    from console.environment import drop_broken_entries
    whole = entry_bytes((1, b"k" * 40), (2, b"h" * 300), (3, b"x" * 5000))
    (tmp_path / "whole.pb").write_bytes(whole)
    (tmp_path / "truncated.pb").write_bytes(whole[:len(whole) - 1000])
    (tmp_path / "no_executable.pb").write_bytes(entry_bytes((1, b"k" * 40), (2, b"h" * 300)))
    (tmp_path / "empty.pb").write_bytes(b"")
    (tmp_path / "writing_now.tmp").write_bytes(whole[:100])
    (tmp_path / "left_by_a_killed_run.tmp").write_bytes(whole[:100])
    hours_ago = os.path.getmtime(tmp_path / "whole.pb") - 2 * 3600
    os.utime(tmp_path / "left_by_a_killed_run.tmp", (hours_ago, hours_ago))
    drop_broken_entries(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["whole.pb", "writing_now.tmp"]


def test_tests_keep_their_own_xla_cache():
    """conftest.py's cache for the test run is the one TensorFlow uses in this process and every main.py the tests
    start: the product's default must not take its place, or the tests would read and write the user's
    ~/.cache. Bug caught: conftest calling runtime_defaults before it sets its own folder."""
    from console.environment import XLA_CACHE_FOLDER
    folder = xla_cache_of(os.environ)
    assert folder is not None
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    assert not os.path.realpath(folder).startswith(os.path.realpath(os.path.join(home, XLA_CACHE_FOLDER))), folder
