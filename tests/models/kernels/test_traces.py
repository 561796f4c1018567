"""The compiled decoder's trace kept on disk (models/kernels/traces.py): a run of the same model reads it back and
traces nothing, sampling the same tokens; the key moves with everything the trace is made from; a damaged file is
traced again and replaced, a folder that takes no file leaves the trace as made, and without a cache folder nothing
is kept (these three on a small program of their own)."""
import dataclasses
import os
import types

import numpy as np
import pytest
import tensorflow.compat.v1 as tf
from tensorflow.core.framework import graph_pb2

from infer.run import Predictor
from models import compiled_decoding
from models.kernels import traces
from models.sampling import SamplingOptions
from tiny import placement_for, random_tokens, tiny_config

CFG = tiny_config(local_attention_radius=4)
ROWS = {"tokens": random_tokens([4, CFG.n_ctx], vocab=CFG.n_vocab, seed=1),
        "prompt_length": np.array((3, 5, 9, 3), np.int32), "seed": np.arange(7, 11, dtype=np.int32)}
SAMPLED = SamplingOptions.from_config(CFG, max_new_tokens=6, temperature=1.0, top_k=20)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An XLA cache folder of the test's own, as TF_XLA_FLAGS names it; returns its traces/ folder."""
    monkeypatch.setenv("TF_XLA_FLAGS", f"--tf_xla_persistent_cache_directory={tmp_path}")
    return tmp_path / "traces"


@pytest.fixture
def traced(monkeypatch):
    """How many times the compiled decoder's program was traced (its Python body run) during the test."""
    count = []
    generate = compiled_decoding.generate
    monkeypatch.setattr(compiled_decoding, "generate", lambda *a, **k: count.append(1) or generate(*a, **k))
    return count


def sample(options=SAMPLED, cfg=CFG) -> dict:
    """The compiled sampler's tokens for ROWS from `cfg`'s seeded initial weights, in a graph and session of its
    own."""
    with Predictor(cfg, placement_for(cfg)) as predictor:
        return predictor.predict(ROWS, len(ROWS["tokens"]), options)


@pytest.mark.slow  # five Predictors; the fast tier keeps the small program's cases and the key's
def test_runs_of_the_model_read_the_decoders_trace_back_and_other_options_or_models_trace_their_own(
        cache, traced, monkeypatch):
    """The compiled decoder, built by five Predictors in turn: the first traces and stores it; a run of the same
    model in another folder reads it back (tracing nothing) and samples the same tokens; greedy sampling and a
    wider window each trace their own; then one Predictor (one graph) reads the sampled and greedy programs back
    together, as the harness's generations do. Bugs caught: the stored file never looked for; the call made
    without XLA's compile mark; the options or the config's model left out of what the trace is made from, or its
    model_path kept in it (every run folder traces again); the called functions stored under TensorFlow's counter
    names (while_body_<n>, counted per process: two processes' files bring two bodies of one name into a graph)."""
    read = []
    call_library = traces._call_library
    monkeypatch.setattr(traces, "_call_library", lambda *a, **k: read.append(call_library(*a, **k)) or read[-1])
    sampled = sample()
    # traced, stored, and called as stored (later processes then load the executable this one compiles)
    assert len(traced) == 1 and len(os.listdir(cache)) == 1 and len(read) == 1 and read[0] is not None
    elsewhere = sample(cfg=dataclasses.replace(CFG, model_path="/elsewhere/run", train_steps=1000))
    assert len(traced) == 1 and len(read) == 2 and read[1] is not None  # read back, not traced
    assert read[1][0].op.get_attr("_XlaMustCompile")
    for name in sampled:
        np.testing.assert_array_equal(elsewhere[name], sampled[name])
    greedy_options = SamplingOptions.from_config(CFG, max_new_tokens=6, temperature=0.0)
    greedy = sample(greedy_options)
    assert len(traced) == 2 and not np.array_equal(greedy["tokens"], sampled["tokens"])
    sample(cfg=dataclasses.replace(CFG, local_attention_radius=8))
    assert len(traced) == 3 and len(os.listdir(cache)) == 3
    with Predictor(CFG, placement_for(CFG)) as predictor:
        for options, want in ((SAMPLED, sampled), (greedy_options, greedy)):
            np.testing.assert_array_equal(predictor.predict(ROWS, len(ROWS["tokens"]), options)["tokens"],
                                          want["tokens"])
    assert len(traced) == 3 and all(outputs is not None for outputs in read[-2:])
    for path in cache.iterdir():
        stored = graph_pb2.GraphDef.FromString(path.read_bytes())
        called = {f.signature.name for f in stored.library.function} - {stored.node[0].op}
        assert called and all(name.endswith("_" + path.stem[:16]) for name in called), (path.stem, called)


def test_the_key_moves_with_everything_the_trace_is_made_from(monkeypatch, tmp_path):
    """Bugs caught: a key without the argument shapes or dtypes, without the source's digest or TensorFlow's
    version; a source digest blind to a file's content, to a file added or to schema.py."""
    with tf.Graph().as_default():
        args = [tf.placeholder(tf.int32, [4, 16]), tf.placeholder(tf.float32, [8])]
        same = traces.key(("cfg", 1), args)
        assert traces.key(("cfg", 1), args) == same
        assert traces.key(("cfg", 2), args) != same
        assert traces.key(("cfg", 1), [args[0], tf.placeholder(tf.float32, [9])]) != same
        assert traces.key(("cfg", 1), [args[0], tf.placeholder(tf.bfloat16, [8])]) != same
        monkeypatch.setattr(traces.tf, "__version__", "0.0.0")
        assert traces.key(("cfg", 1), args) != same
        monkeypatch.undo()
        monkeypatch.setattr(traces, "source_digest", lambda: "edited")
        assert traces.key(("cfg", 1), args) != same
    monkeypatch.undo()
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "a.py").write_text("x = 1\n")
    (tmp_path / "schema.py").write_text("y = 1\n")
    sources = (str(tmp_path / "models"), str(tmp_path / "schema.py"))
    digests = [traces.source_digest.__wrapped__(sources)]
    (tmp_path / "models" / "a.py").write_text("x = 2\n")
    digests.append(traces.source_digest.__wrapped__(sources))
    (tmp_path / "models" / "kernels").mkdir()
    (tmp_path / "models" / "kernels" / "b.cc").write_text("// b\n")
    digests.append(traces.source_digest.__wrapped__(sources))
    (tmp_path / "schema.py").write_text("y = 2\n")
    digests.append(traces.source_digest.__wrapped__(sources))
    assert len(set(digests)) == 4
    assert any(os.path.basename(s) == "schema.py" for s in traces.SOURCES)  # the config's derived values


@pytest.fixture
def small():
    """A small XLA program (a While over a variable) built through traces.call: `small.run(count)` builds and runs
    it in `count` fresh graphs and returns its values; `small.traced` lists its traces during the test."""
    traced = []

    def program():
        traced.append(1)
        return tf.function(lambda v: tf.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x * 1.5),
                                                   [0, v.read_value()])[1:], jit_compile=True, autograph=False)

    def run(count: int = 1, calls: int = 1) -> list:
        """`count` graphs, each calling the program `calls` times (their values listed when more than once)."""
        values = []
        for _ in range(count):
            with tf.Graph().as_default(), tf.Session() as session:
                v = tf.Variable(np.arange(4, dtype=np.float32), use_resource=True)
                outs = [traces.call(program, [v], "the small program")[0] for _ in range(calls)]
                session.run(v.initializer)
                values.append(session.run(outs) if calls > 1 else session.run(outs[0]))
        return values
    return types.SimpleNamespace(run=run, traced=traced)


def test_the_process_that_traces_calls_the_program_as_stored_without_reading_it_back(cache, small, monkeypatch):
    """Bugs caught: the traced call returned (its program, compiled under the traced names, is one no later process
    asks XLA's cache for); the file just written read back from disk."""
    called, read = [], []
    call_library = traces._call_library
    monkeypatch.setattr(traces, "_call_library", lambda *a, **k: called.append(call_library(*a, **k)) or called[-1])
    monkeypatch.setattr(traces, "_call_stored", lambda *a: read.append(a))
    (values,) = small.run()
    assert len(small.traced) == 1 and len(called) == 1 and called[0] is not None and not read
    (path,) = cache.iterdir()
    assert called[0][0].op.get_attr("f").name.endswith("_" + path.stem[:16])
    np.testing.assert_allclose(values, np.arange(4) * 1.5 ** 3)


def test_a_graph_reads_and_imports_a_stored_program_once_for_all_its_calls(cache, small, monkeypatch):
    """The fused Adam pass is called once per device of a mesh, every call in one graph: after the first, a call
    reads no file and imports no function, and computes as the first; a graph of its own reads the file again.
    (Bug: traces.call without its per-graph memo: the file read and its library imported at every call, ~20 ms
    each.)"""
    small.run()  # traced and stored
    read, imports = [], []
    call_stored, import_graph_def = traces._call_stored, tf.import_graph_def
    monkeypatch.setattr(traces, "_call_stored", lambda *a: read.append(a) or call_stored(*a))
    monkeypatch.setattr(traces.tf, "import_graph_def", lambda *a, **k: imports.append(1) or import_graph_def(*a, **k))
    (values,) = small.run(calls=3)
    assert len(read) == 1 and len(imports) == 1 and len(small.traced) == 1
    np.testing.assert_allclose(values, [np.arange(4) * 1.5 ** 3] * 3)
    small.run(calls=2)
    assert len(read) == 2 and len(imports) == 2


def test_a_damaged_file_is_traced_again_and_replaced(cache, small):
    """Bug caught: an unreadable file raising out of the build instead of being traced again."""
    want = small.run()
    (path,) = cache.iterdir()
    path.write_bytes(b"not a trace")
    got = small.run()
    assert len(small.traced) == 2 and path.read_bytes() != b"not a trace"
    np.testing.assert_array_equal(got, want)
    small.run()
    assert len(small.traced) == 2  # the replacement is read back


@pytest.mark.parametrize("failing", ["open", "replace"])
def test_a_folder_that_takes_no_file_leaves_the_trace_as_made_and_no_partial_file(cache, small, monkeypatch,
                                                                                    failing):
    """A full disk (or a read-only mount) when the file is made or put in place (modelpath/files.py's
    `write_atomically`). Bugs caught: the error let through (the sampler fails for a cache folder); the partial
    file left behind when putting it in place fails."""
    from modelpath import files

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(files if failing == "open" else files.os, failing, full, raising=False)
    values = small.run(2)
    assert len(small.traced) == 2 and (not cache.exists() or not os.listdir(cache))
    np.testing.assert_allclose(values, [np.arange(4) * 1.5 ** 3] * 2)


def test_without_a_cache_folder_nothing_is_kept(monkeypatch, small):
    monkeypatch.setenv("TF_XLA_FLAGS", "")
    assert traces.folder() is None
    small.run(2)
    assert len(small.traced) == 2
