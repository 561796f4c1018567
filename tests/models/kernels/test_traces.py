"""The compiled decoder's trace kept on disk (models/kernels/traces.py): a second build reads it back and traces
nothing, sampling the same tokens; the key moves with everything the trace is made from; a damaged file is traced
again and replaced, a folder that takes no file leaves the trace as made, and without a cache folder nothing is
kept."""
import dataclasses
import os

import numpy as np
import pytest

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


def test_a_second_build_reads_the_trace_back_and_samples_the_same_tokens(cache, traced, monkeypatch):
    """Bugs caught: the stored file never looked for (traced twice); the call made without XLA's compile mark (the
    program then runs op by op: `compiled_decoding`'s While over XLA-only ops fails)."""
    first = sample()
    assert len(traced) == 1 and len(os.listdir(cache)) == 1
    read = []
    call_stored = traces._call_stored
    monkeypatch.setattr(traces, "_call_stored", lambda *a: read.append(call_stored(*a)) or read[-1])
    second = sample()
    assert len(traced) == 1 and len(read) == 1 and read[0] is not None  # read back, not traced
    for name in first:
        np.testing.assert_array_equal(second[name], first[name])
    assert read[0][0].op.get_attr("_XlaMustCompile")


def test_the_key_moves_with_everything_the_trace_is_made_from(monkeypatch, tmp_path):
    """Bugs caught: a key without the argument shapes or dtypes, without the source's digest or TensorFlow's
    version; a source digest blind to a file's content, to a file added or to schema.py."""
    import tensorflow.compat.v1 as tf
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


def test_the_sampling_options_and_the_model_make_traces_of_their_own_and_the_runs_folders_do_not(cache, traced):
    """Bugs caught: the options or the config's model left out of what the decoder's trace is made from (greedy
    read back as sampled, a window of 8 as one of 4); the config's model_path kept in it (a run in another folder,
    a ladder's or a benchmark's, traces the same program again)."""
    sampled = sample()
    greedy = sample(SamplingOptions.from_config(CFG, max_new_tokens=6, temperature=0.0))
    assert len(traced) == 2 and len(os.listdir(cache)) == 2
    assert not np.array_equal(sampled["tokens"], greedy["tokens"])
    elsewhere = sample(cfg=dataclasses.replace(CFG, model_path="/elsewhere/run", train_steps=1000))
    assert len(traced) == 2
    np.testing.assert_array_equal(elsewhere["tokens"], sampled["tokens"])
    sample(cfg=dataclasses.replace(CFG, local_attention_radius=8))
    assert len(traced) == 3 and len(os.listdir(cache)) == 3


def test_two_stored_programs_are_read_back_into_one_graph(cache, traced):
    """The harness's greedy and sampled generations, both read back by one Predictor (one graph). TensorFlow names
    a While's body by a process-wide count (while_body_<n>), so two processes name two different bodies alike:
    a stored file names the functions its program calls after itself. Bug caught: the called functions stored
    under TensorFlow's names (two files from two processes then bring two bodies of one name, which the graph
    refuses)."""
    from tensorflow.core.framework import graph_pb2
    greedy = SamplingOptions.from_config(CFG, max_new_tokens=6, temperature=0.0)
    want = {options: sample(options) for options in (SAMPLED, greedy)}
    assert len(traced) == 2
    with Predictor(CFG, placement_for(CFG)) as predictor:
        for options in (SAMPLED, greedy):
            np.testing.assert_array_equal(predictor.predict(ROWS, len(ROWS["tokens"]), options)["tokens"],
                                          want[options]["tokens"])
    assert len(traced) == 2
    for path in cache.iterdir():
        stored = graph_pb2.GraphDef.FromString(path.read_bytes())
        called = {f.signature.name for f in stored.library.function} - {stored.node[0].op}
        assert called and all(name.endswith("_" + path.stem[:16]) for name in called), (path.stem, called)


def test_a_damaged_file_is_traced_again_and_replaced(cache, traced):
    """Bug caught: an unreadable file raising out of the build instead of being traced again."""
    want = sample()
    (path,) = cache.iterdir()
    path.write_bytes(b"not a trace")
    got = sample()
    assert len(traced) == 2
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    assert path.read_bytes() != b"not a trace"
    sample()
    assert len(traced) == 2  # the replacement is read back


@pytest.mark.parametrize("failing", ["mkstemp", "replace"])
def test_a_folder_that_takes_no_file_leaves_the_trace_as_made_and_no_partial_file(cache, traced, monkeypatch,
                                                                                    failing):
    """A full disk (or a read-only mount) when the file is made or put in place. Bug caught: the partial file
    left behind when putting it in place fails."""
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(getattr(traces, "tempfile" if failing == "mkstemp" else "os"), failing, full)
    sample()
    sample()
    assert len(traced) == 2 and (not cache.exists() or not os.listdir(cache))


def test_without_a_cache_folder_nothing_is_kept(monkeypatch, traced):
    monkeypatch.setenv("TF_XLA_FLAGS", "")
    assert traces.folder() is None
    sample()
    sample()
    assert len(traced) == 2
