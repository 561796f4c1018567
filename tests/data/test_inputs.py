"""The tf.data pipeline: shapes, sampling modes, determinism, exact resume, mixing, eval, errors."""

import os

import numpy as np
import pytest
import tensorflow as tf

from data.create_tfrecords import output_file_name
from data.errors import DataError
from data.inputs import DatasetSource, eval_batches, eval_dataset, pipeline_error, token_stats, train_dataset

POSITIONS = 1000  # token = base + document * POSITIONS + position: every token says where it came from


def synthetic_documents(lengths, base=1):
    return [[base + document * POSITIONS + position for position in range(length)] for document, length in enumerate(lengths)]


def write_files(folder, name, documents, per_file):
    """Write documents in files of ``per_file`` records, named like create_tfrecords names them."""
    os.makedirs(folder, exist_ok=True)
    for index, start in enumerate(range(0, len(documents), per_file)):
        part = documents[start:start + per_file]
        with tf.io.TFRecordWriter(os.path.join(folder, output_file_name(name, index, len(part)))) as writer:
            for tokens in part:
                feature = tf.train.Feature(int64_list=tf.train.Int64List(value=tokens))
                writer.write(tf.train.Example(features=tf.train.Features(feature={"text": feature})).SerializeToString())
    return os.path.join(folder, f"{name}_*.tfrecords")


def take(dataset, batches):
    return [(inputs.numpy(), labels.numpy()) for inputs, labels in dataset.take(batches)]


def windows_of(batches):
    """Rebuild the n_ctx+1 windows from (inputs, labels)."""
    return [np.concatenate([inputs[row], labels[row, -1:]]) for inputs, labels in batches for row in range(len(inputs))]


@pytest.fixture(scope="module")
def documents_glob(tmp_path_factory):
    """40 documents of varied lengths in files of 15, 15 and 10 records."""
    lengths = [6 + (7 * d) % 13 for d in range(40)]
    return write_files(str(tmp_path_factory.mktemp("docs")), "docs", synthetic_documents(lengths), 15), lengths


def test_batches_have_static_shapes_and_shifted_labels(documents_glob):
    path, _ = documents_glob
    dataset = train_dataset([DatasetSource(path, 2, "documents_random")], n_ctx=8, batch_size=4, seed=1)
    assert dataset.element_spec[0].shape.as_list() == [4, 8] and dataset.element_spec[0].dtype == tf.int32
    for inputs, labels in take(dataset, 5):
        assert inputs.shape == labels.shape == (4, 8)
        np.testing.assert_array_equal(inputs[:, 1:], labels[:, :-1])


def test_same_seed_same_batches_other_seed_other_batches(documents_glob):
    path, _ = documents_glob
    make = lambda seed: take(train_dataset([DatasetSource(path, 2, "documents_random")], 8, 4, seed), 10)
    first, again, other = make(7), make(7), make(8)
    assert all((a[0] == b[0]).all() for a, b in zip(first, again))
    assert any((a[0] != c[0]).any() for a, c in zip(first, other))


@pytest.mark.parametrize("mode, stitch, n_ctx", [("documents_random", 2, 8), ("documents_fixed", 2, 8), ("documents_random", 1, 4), ("chunks", 1, 8), ("sequential", 1, 8)])
def test_resume_gives_exactly_the_uninterrupted_batches(documents_glob, tmp_path, mode, stitch, n_ctx):
    path, _ = documents_glob
    if mode in ("chunks", "sequential"):
        path = write_files(str(tmp_path), "chunks", synthetic_documents([9] * 23), 5)
    steps = 40  # 40 * 4 examples * 2 documents crosses epochs, files and shuffle blocks
    sources = [DatasetSource(path, stitch, mode)]
    uninterrupted = take(train_dataset(sources, n_ctx, 4, seed=3), 2 * steps)
    resumed = take(train_dataset(sources, n_ctx, 4, seed=3, start_step=steps), steps)
    for (inputs, labels), (resumed_inputs, resumed_labels) in zip(uninterrupted[steps:], resumed):
        np.testing.assert_array_equal(inputs, resumed_inputs)
        np.testing.assert_array_equal(labels, resumed_labels)


def test_resume_with_mixed_sources(documents_glob, tmp_path):
    path, _ = documents_glob
    other = write_files(str(tmp_path), "other", synthetic_documents([12] * 30, base=500_000), 7)
    sources = [DatasetSource(path, 2, "documents_random", 2.0), DatasetSource(other, 1, "documents_fixed", 1.0)]
    uninterrupted = take(train_dataset(sources, 8, 3, seed=5), 40)
    resumed = take(train_dataset(sources, 8, 3, seed=5, start_step=23), 17)
    assert len(resumed) == 17 and all((a[0] == b[0]).all() for a, b in zip(uninterrupted[23:], resumed))


@pytest.mark.parametrize("mode", ["documents_random", "sequential"])
def test_moved_data_gives_the_same_batches(documents_glob, tmp_path, mode):
    """A run's data moved to another folder (a repository cloned elsewhere, a run continued on another host with
    another home directory) gives the same batches, so a resumed run still trains on what the uninterrupted one
    would have. Bug caught: a source's random decisions seeded by its absolute path."""
    import shutil
    path, _ = documents_glob
    if mode == "sequential":  # whole chunks of n_ctx+1 tokens, its files in a seeded order each epoch
        path = write_files(str(tmp_path / "chunks"), "chunks", synthetic_documents([9] * 23), 5)
    other = write_files(str(tmp_path / "here"), "other", synthetic_documents([12] * 30, base=500_000), 7)

    def batches(first, second):
        sources = [DatasetSource(first, 1 if mode == "sequential" else 2, mode, 2.0),
                   DatasetSource(second, 1, "documents_fixed", 1.0)]
        return take(train_dataset(sources, 8, 3, seed=5), 12)

    moved = tmp_path / "elsewhere" / "deeper"
    shutil.copytree(os.path.dirname(path), moved / "docs")
    shutil.copytree(os.path.dirname(other), moved / "other")
    for (a, _), (b, _) in zip(batches(path, other), batches(str(moved / "docs" / os.path.basename(path)),
                                                               str(moved / "other" / os.path.basename(other))),
                              strict=True):
        np.testing.assert_array_equal(a, b)


def test_documents_random_windows_are_contiguous_slices_of_stitched_documents(documents_glob):
    path, lengths = documents_glob
    stitch = 3
    windows = windows_of(take(train_dataset([DatasetSource(path, stitch, "documents_random")], 8, 4, seed=2), 25))
    starts = set()
    for window in windows:
        documents, positions = (window - 1) // POSITIONS, (window - 1) % POSITIONS
        starts.add(int(positions[0]))
        assert len(set(documents.tolist())) <= stitch
        for previous in range(len(window) - 1):
            same_document = documents[previous] == documents[previous + 1] and positions[previous + 1] == positions[previous] + 1
            next_document = positions[previous] == lengths[documents[previous]] - 1 and positions[previous + 1] == 0
            assert same_document or next_document
    assert len(starts) > 3  # the offset really is random


def test_documents_fixed_takes_group_starts_and_visits_documents_evenly(tmp_path):
    lengths = [20] * 32  # 32 documents divide the 256-document shuffle block: 8 visits each
    path = write_files(str(tmp_path), "fixed", synthetic_documents(lengths), 16)
    windows = windows_of(take(train_dataset([DatasetSource(path, 1, "documents_fixed")], 8, 8, seed=4), 32))
    documents = [int((w[0] - 1) // POSITIONS) for w in windows]
    for window, document in zip(windows, documents):
        np.testing.assert_array_equal(window, synthetic_documents(lengths)[document][:9])
    assert np.bincount(documents).tolist() == [8] * 32
    assert documents[:32] != sorted(documents[:32])  # shuffled, not file order


def test_chunks_are_read_in_order_and_cycle(tmp_path):
    chunks = synthetic_documents([11] * 7)  # longer than n_ctx+1: the first n_ctx+1 tokens are used
    path = write_files(str(tmp_path), "chunks", chunks, 3)
    windows = windows_of(take(train_dataset([DatasetSource(path, 1, "chunks")], 8, 3, seed=0), 7))
    expected = [chunks[i % 7][:9] for i in range(21)]
    assert [w.tolist() for w in windows] == expected


def epochs_of(windows, records_per_epoch):
    """The record ids read, one list per epoch."""
    ids = [int((w[0] - 1) // POSITIONS) for w in windows]
    return [ids[i:i + records_per_epoch] for i in range(0, len(ids) - records_per_epoch + 1, records_per_epoch)]


def test_sequential_reads_each_file_in_order_and_the_files_in_a_seeded_order_per_epoch(tmp_path):
    """GPT-Neo's sequential_input: pre-chunked records, each file front to back; the files in a seeded order
    (shuffle_input_filenames), a new one every epoch; every record once per epoch."""
    chunks = synthetic_documents([9] * 23)
    files = [list(range(start, min(start + 5, 23))) for start in range(0, 23, 5)]  # 5, 5, 5, 5, 3 records
    path = write_files(str(tmp_path), "chunks", chunks, 5)
    read = lambda seed, **kw: windows_of(take(train_dataset([DatasetSource(path, 1, "sequential", **kw)], 8, 23, seed), 6))
    windows = read(seed=2)
    for window in windows:
        np.testing.assert_array_equal(window, chunks[int((window[0] - 1) // POSITIONS)][:9])
    epochs = epochs_of(windows, 23)
    assert len(epochs) == 6
    orders = []
    for epoch in epochs:
        assert sorted(epoch) == list(range(23))
        position, order = 0, []
        while position < 23:
            file = next(i for i, f in enumerate(files) if f[0] == epoch[position])
            assert epoch[position:position + len(files[file])] == files[file]  # a whole file, in order
            order.append(file)
            position += len(files[file])
        orders.append(order)
    assert len({tuple(o) for o in orders}) > 1 and any(o != sorted(o) for o in orders)
    assert [w.tolist() for w in read(seed=2)] == [w.tolist() for w in windows]        # the same seed, the same
    assert [w.tolist() for w in read(seed=3)] != [w.tolist() for w in windows]        # another seed, another
    unshuffled = read(seed=2, shuffle_files=False)  # shuffle_input_filenames false: file order, like chunks
    assert epochs_of(unshuffled, 23) == [list(range(23))] * 6


def test_resume_with_a_sequential_source_in_the_mix(documents_glob, tmp_path):
    path, _ = documents_glob
    chunks = write_files(str(tmp_path), "chunks", synthetic_documents([9] * 23, base=500_000), 4)
    sources = [DatasetSource(path, 2, "documents_random", 1.0), DatasetSource(chunks, 1, "sequential", 2.0)]
    uninterrupted = take(train_dataset(sources, 8, 3, seed=5), 60)
    resumed = take(train_dataset(sources, 8, 3, seed=5, start_step=37), 23)
    assert len(resumed) == 23 and all((a[0] == b[0]).all() for a, b in zip(uninterrupted[37:], resumed))


def test_records_longer_than_the_window_give_their_first_window_with_a_warning(tmp_path, capsys):
    chunks = synthetic_documents([20] * 6)
    path = write_files(str(tmp_path), "long", chunks, 3)
    windows = windows_of(take(train_dataset([DatasetSource(path, 1, "sequential", shuffle_files=False)], 8, 3, 0), 2))
    assert [w.tolist() for w in windows] == [c[:9] for c in chunks]
    assert "warning:" in capsys.readouterr().err


def test_mixing_respects_weights(tmp_path):
    heavy = write_files(str(tmp_path), "heavy", synthetic_documents([10] * 20), 10)
    light = write_files(str(tmp_path), "light", synthetic_documents([10] * 20, base=500_000), 10)
    sources = [DatasetSource(heavy, 1, "documents_random", 3.0), DatasetSource(light, 1, "documents_random", 1.0)]
    windows = windows_of(take(train_dataset(sources, 8, 16, seed=9), 100))
    heavy_share = np.mean([w[0] < 500_000 for w in windows])
    assert abs(heavy_share - 0.75) < 0.05


def test_eval_dataset_is_the_ordered_stream_cut_into_windows(documents_glob):
    path, lengths = documents_glob
    stream = [t for document in synthetic_documents(lengths) for t in document]
    window, batch = 9, 4
    expected = [stream[i:i + window] for i in range(0, len(stream) - window + 1, window)]
    expected = expected[:len(expected) // batch * batch]
    batches = take(eval_dataset(path, window - 1, batch), 10_000)
    assert len(batches) == eval_batches(path, window - 1, batch) == len(expected) // batch
    assert [w.tolist() for w in windows_of(batches)] == expected


def test_token_stats(documents_glob):
    path, lengths = documents_glob
    documents = synthetic_documents(lengths)
    stats = token_stats(path)
    assert stats["files"] == 3 and stats["documents"] == len(documents) and stats["tokens"] == sum(lengths)
    assert stats["min_token_id"] == min(map(min, documents)) and stats["max_token_id"] == max(map(max, documents))
    assert (stats["min_document_tokens"], stats["max_document_tokens"]) == (min(lengths), max(lengths))
    assert token_stats(path, max_records=5)["documents"] == 5


def test_glob_matching_nothing(tmp_path):
    with pytest.raises(DataError, match="no tfrecords files match"):
        train_dataset([DatasetSource(str(tmp_path / "*.tfrecords"), 1, "documents_random")], 8, 2, 0)
    with pytest.raises(DataError, match="no tfrecords files match"):
        eval_dataset(str(tmp_path / "*.tfrecords"), 8, 2)


def test_truncated_file_is_named(tmp_path):
    path = write_files(str(tmp_path), "cut", synthetic_documents([30] * 6), 6)
    (file_path,) = tf.io.gfile.glob(path)
    with open(file_path, "r+b") as handle:
        handle.truncate(os.path.getsize(file_path) - 20)
    for build in (lambda: train_dataset([DatasetSource(path, 1, "documents_random")], 8, 2, 0), lambda: token_stats(path)):
        with pytest.raises(DataError, match="corrupt tfrecords file .*cut_0_6.tfrecords"):
            build()


def test_corrupted_bytes_are_reported_by_token_stats(tmp_path):
    path = write_files(str(tmp_path), "flip", synthetic_documents([30] * 3), 3)
    (file_path,) = tf.io.gfile.glob(path)
    data = bytearray(open(file_path, "rb").read())
    data[40] ^= 0xFF  # inside the first record's payload
    open(file_path, "wb").write(bytes(data))
    with pytest.raises(DataError, match="corrupt tfrecords file .*flip_0_3.tfrecords"):
        token_stats(path)


def test_count_in_name_must_match(tmp_path):
    path = write_files(str(tmp_path), "n", synthetic_documents([30] * 4), 4)
    (file_path,) = tf.io.gfile.glob(path)
    os.rename(file_path, file_path.replace("_0_4.", "_0_5."))
    with pytest.raises(DataError, match="holds 4 records but its name says 5"):
        token_stats(path)


def test_stitch_too_small_is_refused_at_build_time(documents_glob):
    path, lengths = documents_glob
    n_ctx = 2 * min(lengths)  # two of the shortest documents cannot fill n_ctx + 1 tokens
    with pytest.raises(DataError, match="raise stitch"):
        train_dataset([DatasetSource(path, 2, "documents_random")], n_ctx, 2, 0)


def test_short_chunks_are_refused(tmp_path):
    path = write_files(str(tmp_path), "c", synthetic_documents([5] * 4), 4)
    with pytest.raises(DataError, match="--n_ctx 8"):
        train_dataset([DatasetSource(path, 1, "chunks")], 8, 2, 0)


def test_a_short_group_found_later_stops_training_instead_of_a_short_window(tmp_path):
    long_first = synthetic_documents([20] * 256 + [3] * 40)  # the build-time sample sees only long ones
    path = write_files(str(tmp_path), "late", long_first, 256)
    dataset = train_dataset([DatasetSource(path, 1, "documents_fixed")], 8, 10, 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="fewer than n_ctx\\+1"):
        take(dataset, 60)


@pytest.mark.parametrize("source, message", [
    (DatasetSource("x", 1, "random_sample"), "unknown sampling mode"),
    (DatasetSource("x", 0, "documents_random"), "stitch must be"),
    (DatasetSource("x", 1, "documents_random", 0.0), "weight must be > 0"),
])
def test_bad_source_settings(source, message):
    with pytest.raises(DataError, match=message):
        train_dataset([source], 8, 2, 0)


def test_token_ids_beyond_n_vocab_are_refused_at_build_time(documents_glob):
    path, _ = documents_glob
    with pytest.raises(DataError, match="holds token id .* outside the model's vocabulary \\(0 <= id < n_vocab = 100\\)") as error:
        train_dataset([DatasetSource(path, 2, "documents_random")], 8, 2, 0, n_vocab=100)
    assert "\n" not in str(error.value)
    largest = token_stats(path)["max_token_id"]
    take(train_dataset([DatasetSource(path, 2, "documents_random")], 8, 2, 0, n_vocab=largest + 1), 3)  # in range: fine


def test_token_ids_beyond_n_vocab_found_later_become_one_line_data_errors(tmp_path):
    """Past the documents the build-time check reads, the graph asserts; pipeline_error gives the one line back."""
    in_range = [[1 + (d + p) % 50 for p in range(12)] for d in range(256)]
    path = write_files(str(tmp_path), "late", in_range + [[1] * 11 + [77]] * 256, 256)
    sources = [DatasetSource(path, 1, "documents_fixed")]
    for dataset in (train_dataset(sources, 11, 16, 0, n_vocab=64), eval_dataset(path, 11, 16, n_vocab=64)):
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            take(dataset, 100)
        error = pipeline_error(raised.value)
        assert isinstance(error, DataError) and "\n" not in str(error)
        assert str(error).startswith(f"a batch from {path} holds a token id outside the model's vocabulary (0 <= id < n_vocab = 64)")
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        take(train_dataset([DatasetSource(write_files(str(tmp_path), "short", in_range + [[1] * 3] * 40, 256), 1, "documents_fixed")], 8, 10, 0), 60)
    assert "has fewer than n_ctx+1 = 9 tokens" in str(pipeline_error(raised.value))
    assert pipeline_error(tf.errors.InvalidArgumentError(None, None, "some other failure")) is None


def test_a_damaged_record_found_while_reading_becomes_a_one_line_data_error(tmp_path):
    """The build-time check reads the first file; a checksum failure in a later one surfaces as DataLossError."""
    path = write_files(str(tmp_path), "flip", synthetic_documents([20] * 72), 8)  # files of 8 documents
    damaged = sorted(tf.io.gfile.glob(path))[-1]
    data = bytearray(open(damaged, "rb").read())
    record = len(data) // 8  # equal records: 12-byte header, payload, 4-byte checksum
    data[4 * record + 12 + 5] ^= 0xFF  # inside a payload: the length fields stay right
    open(damaged, "wb").write(bytes(data))
    with pytest.raises(tf.errors.DataLossError) as raised:
        take(train_dataset([DatasetSource(path, 1, "documents_fixed")], 8, 16, 0), 20)
    error = pipeline_error(raised.value)
    assert isinstance(error, DataError) and "\n" not in str(error)
    assert str(error).startswith("a tfrecords file is corrupt (corrupted record at ") and "--check_dataset" in str(error)


def test_the_pipelines_functions_are_traced_without_autograph(documents_glob, tmp_path, autograph_conversions):
    """Every function a training or evaluation pipeline hands tf.data (the sources' choice, the shuffled blocks,
    the groups' windows, the prechunked records, the epochs' files, the batches' split and check, the eval stream's
    cut) is traced as it is written, not rewritten by AutoGraph first, which was a third of a pipeline's build.
    (Bug: one of them handed over without data/inputs.py's `_plain`, e.g. `.map(split)`.)"""
    path, _ = documents_glob
    chunks = write_files(str(tmp_path), "chunks", synthetic_documents([9] * 23), 5)
    sources = [DatasetSource(path, 2, "documents_random", 1.0), DatasetSource(chunks, 1, "sequential", 2.0),
               DatasetSource(chunks, 1, "chunks", 1.0)]
    assert len(take(train_dataset(sources, 8, 3, seed=5, n_vocab=10 ** 7), 2)) == 2
    assert len(take(eval_dataset(path, 8, 2, n_vocab=10 ** 7), 1)) == 1
    assert autograph_conversions == []


def test_the_graph_hash_is_the_numpy_hash_with_its_leading_integers_folded():
    """_hash_tf gives _hash_np's values for the argument lists the pipeline hashes (plain integers first, then
    tensors; values past 2**31 - 1, whose second part counts), and mixes only its tensors in ops: three
    multipliers and two parts a tensor. Bugs caught: the folded state dropped (the tensors mixed into the initial
    constant: other file orders, windows and source choices than the first epoch's numpy order and a resume
    compute); the integers mixed in ops again (2.5x the ops in every pipeline's functions)."""
    from data import inputs
    seed, tag, big = 1234, 7, 3 * 2 ** 40 + 5
    cases = [((seed, tag, inputs._FILE_ORDER), (3, np.arange(5))),  # a later epoch's file order
             ((seed, tag, inputs._WINDOW_OFFSET), (big,)), ((seed, inputs._SOURCE_CHOICE), (np.arange(4) + big,)),
             ((), (np.arange(3), seed))]
    for integers, tensors in cases:
        tensors = [np.asarray(v, np.int64) for v in tensors]
        graph = tf.Graph()
        with graph.as_default():
            hashed = inputs._hash_tf(*integers, *[tf.constant(v) for v in tensors])
            with tf.compat.v1.Session(graph=graph) as session:
                np.testing.assert_array_equal(session.run(hashed), inputs._hash_np(*integers, *tensors))
        # a tensor: its low part's mod and each part's three mixing rounds' mods
        mods = sum(op.type == "FloorMod" for op in graph.get_operations())
        assert mods == len(tensors) * (1 + 2 * len(inputs._MULTIPLIERS)), (integers, mods)
