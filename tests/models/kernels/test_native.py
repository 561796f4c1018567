"""The native (C++) decoding products (models/kernels/native.py, matvec.cc): their values against NumPy in float64
for fp32 and bf16 weights, both layouts, row counts and shapes that leave remainders in every split; the library
built once per cache folder and whole or not at all; and what happens without a compiler."""
import os
import threading

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from models.kernels import native


def compiler_found() -> bool:
    """Whether native.py finds a C++ compiler here ($CXX, g++ or c++): without one its products are XLA's by
    design, and the tests that need the library skip (tests elsewhere take this helper by its dotted name)."""
    try:
        native.compiler()
        return True
    except native.NativeUnavailable:
        return False


@pytest.fixture
def unloaded(monkeypatch):
    """native.py's process state as before any build (put back after the test)."""
    monkeypatch.setattr(native, "_loaded", None)
    monkeypatch.setattr(native, "_why_not", None)
    monkeypatch.setattr(native, "_noted", False)


@pytest.fixture(scope="module")
def library():
    if not compiler_found():
        pytest.skip("no C++ compiler here: the native kernels cannot be built")
    lib = native.library()
    assert lib is not None, native.why_not()
    return lib


def run_product(x, w, transposed, dtype):
    """native.product inside an XLA program, w rounded to `dtype` first."""
    @tf.function(jit_compile=True, autograph=False)
    def program(x, w):
        return native.product(x, tf.cast(w, dtype), transposed)
    with tf.Graph().as_default(), tf.Session() as session:
        return session.run(program(tf.constant(x), tf.constant(w)))


def oracle(x, w, transposed, dtype):
    w = tf.as_dtype(dtype).as_numpy_dtype(w).astype(np.float64)  # the weights' values in their dtype
    return x.astype(np.float64) @ (w.T if transposed else w)


# rows: one (a step at batch 1), three, sixteen (native.MAX_ROWS); k not a multiple of the kernel's four-row
# groups nor of the two cores' split; n not a multiple of the 16-column split
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("transposed", [False, True], ids=["w[k,n]", "w[n,k]"])
@pytest.mark.parametrize("rows,k,n", [(1, 512, 1536), (3, 37, 203), (16, 130, 64), (1, 6, 5)])
def test_products_are_numpys_in_float64_for_the_weights_as_stored(library, dtype, transposed, rows, k, n):
    rng = np.random.RandomState(rows * 1000 + k)
    x = rng.randn(rows, k).astype(np.float32)
    w = rng.randn(*((n, k) if transposed else (k, n))).astype(np.float32)
    got = run_product(x, w, transposed, dtype)
    want = oracle(x, w, transposed, dtype)
    assert got.shape == (rows, n)
    # fp32 sums of k terms: a few ulps of the terms' magnitudes
    bound = 1e-6 * np.sqrt(k) * np.abs(x).max() * np.abs(w).max() * 4
    np.testing.assert_allclose(got, want, rtol=0, atol=bound)
    if dtype == tf.bfloat16:  # the bf16 weights' values, not the fp32 ones
        assert np.abs(got - oracle(x, w, transposed, tf.float32)).max() > 10 * bound


def test_products_called_from_two_threads_at_once_are_each_right(library):
    """Two programs at once: one gets the worker threads, the other computes alone (never a shared pool's mix)."""
    rng = np.random.RandomState(0)
    x = rng.randn(2, 512).astype(np.float32)
    w = rng.randn(512, 2048).astype(np.float32)
    want = oracle(x, w, False, tf.float32)
    results, errors = [], []
    with tf.Graph().as_default(), tf.Session() as session:
        program = tf.function(lambda x, w: native.product(x, w), jit_compile=True, autograph=False)
        y = program(tf.constant(x), tf.constant(w))
        session.run(y)

        def many():
            try:
                results.extend(session.run(y) for _ in range(50))
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)
        threads = [threading.Thread(target=many) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors and len(results) == 100
    for got in results:
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)


def test_the_library_is_built_once_per_folder_and_whole(library, tmp_path, monkeypatch):
    """A second build finds the first's file (no compile); nothing half-written stays in the folder."""
    monkeypatch.setenv("TF_XLA_FLAGS", f"--tf_xla_persistent_cache_directory={tmp_path}")
    path, temporary = native._build()
    assert not temporary and os.path.dirname(path) == str(tmp_path / "native")
    built = os.stat(path).st_mtime_ns
    commands, run = [], native.subprocess.run
    monkeypatch.setattr(native.subprocess, "run", lambda command, **kw: commands.append(command) or run(command, **kw))
    assert native._build() == (path, False) and os.stat(path).st_mtime_ns == built
    assert commands and not any("-shared" in command for command in commands)  # asked the version, compiled nothing
    assert os.listdir(tmp_path / "native") == [os.path.basename(path)]


def test_a_failed_compile_leaves_no_library_and_says_why(library, tmp_path, monkeypatch):
    monkeypatch.setenv("TF_XLA_FLAGS", f"--tf_xla_persistent_cache_directory={tmp_path}")
    broken = tmp_path / "broken.cc"
    broken.write_text("this is not C++;\n")
    monkeypatch.setattr(native, "SOURCE", str(broken))
    with pytest.raises(native.NativeUnavailable, match="failed on broken.cc: .*error"):
        native._build()
    assert os.listdir(tmp_path / "native") == []


def test_without_a_compiler_the_products_are_xlas_and_one_note_says_why(unloaded, monkeypatch, capsys):
    monkeypatch.setenv("CXX", "no-such-compiler")
    assert native.library() is None and native.library() is None
    assert "CXX=no-such-compiler is not a command" in native.why_not()
    err = capsys.readouterr().err
    assert err.count("note: decoding's matrix-vector products run as XLA's (CXX=no-such-compiler") == 1


@pytest.mark.parametrize("setting", ["off", "0", "false"])
def test_the_switch_turns_the_library_off(monkeypatch, setting):
    monkeypatch.setenv(native.SWITCH, setting)
    assert native.library() is None and native.why_not() == f"{native.SWITCH} is off"


def test_a_library_that_cannot_be_written_leaves_xlas_products_and_a_note(library, unloaded, tmp_path, monkeypatch,
                                                                           capsys):
    """A cache folder that takes no file after all (a full disk, a read-only mount): a note, not a crash."""
    monkeypatch.setenv("TF_XLA_FLAGS", f"--tf_xla_persistent_cache_directory={tmp_path}")

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(native.tempfile, "mkstemp", full)
    monkeypatch.setattr(native, "SOURCE", str(tmp_path / "changed.cc"))  # not in the cache: it must be written
    (tmp_path / "changed.cc").write_text("// another source\n")
    assert native.library() is None
    assert native.why_not() == "cannot build the library: No space left on device"
    assert "note: decoding's matrix-vector products run as XLA's (cannot build" in capsys.readouterr().err
