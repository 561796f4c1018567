"""The tf.data input pipeline: tfrecords of token ids -> (inputs, labels) batches.

Built only from tf.data / TF ops so it runs inside the runner's graph (train/loop.py), in graph mode.

Determinism and exact resume are the design constraints. Every random decision is a
stateless function of (seed, source, position): the file order of each epoch, a shuffle
within blocks of documents, the offset of each random window, and which source each mixed
example comes from. Nothing depends on iterator state, so ``train_dataset(start_step=s)``
can compute, in Python, how many documents each source had consumed before step ``s`` and
start there: whole files are skipped using the example counts in the file names
(``{name}_{i}_{N}.tfrecords``), and only the tail of one file and of one shuffle block is
read and discarded. The same integer hash is implemented for NumPy (to plan the skip) and
for TF (inside the graph); it uses only exact int64 arithmetic below 2**48 so both agree bit
for bit.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import sys
import zlib
from dataclasses import dataclass
from typing import Optional

import numpy as np
import tensorflow as tf

try:  # TensorFlow's internals (2.20, 2.21): without them tf_record_iterator's deprecation warning is printed
    from tensorflow.python.util.deprecation import silence as silenced_deprecation
except ImportError:
    silenced_deprecation = None

# tf.data traces the functions it is given through AutoGraph unless they say not to. The pipeline's are plain
# TensorFlow (no Python `if` or `for` over tensors), and AutoGraph's conversion (reading each function's source,
# rewriting it and the helpers it calls) was a third of a pipeline's build: tests/data/test_inputs.py 34.4 -> 21.8
# CPU s with it off. Every function handed to map, flat_map and scan here is wrapped in `_plain`.
_plain = tf.autograph.experimental.do_not_convert

from schema import ConfigError, GPTConfig, closest
from data.errors import DataError

SHUFFLE_BLOCK_DOCUMENTS = 256  # documents shuffled together; also the most a resume reads and discards
SAMPLE_DOCUMENTS_FOR_CHECKS = 256  # documents read at build time to catch a too-small stitch early
_PRIME = 2147483647  # 2**31 - 1
_MULTIPLIERS = (48271, 69621, 40692)
_FOREVER = sys.maxsize
# Domain tags keep the hash streams for different decisions independent.
_FILE_ORDER, _BLOCK_SHUFFLE, _WINDOW_OFFSET, _SOURCE_CHOICE = 1, 2, 3, 4


@dataclass(frozen=True)
class DatasetSource:
    """One entry of the config's "datasets": [[id, stitch, sampling_mode, weight]], resolved to a glob."""

    path: str  # tfrecords glob
    stitch: int
    sampling_mode: str  # a name in SAMPLING_MODES
    weight: float = 1.0
    shuffle_files: bool = True  # modes with a seeded file order (shuffle_input_filenames): off keeps the files' own


@dataclass(frozen=True)
class SamplingMode:
    """How a dataset's records become n_ctx+1 windows. A new mode is one entry of SAMPLING_MODES: the config
    accepts every name there (config.py), the pipeline reads by these facts."""
    prechunked: bool             # one window per record (create_tfrecords --mode chunks), each file front to back;
                                 # else whole documents, `stitch` of them joined, windows cut from the join
    random_offset: bool = False  # documents: the window starts at a seeded random offset (else at the start)
    seeded_file_order: bool = False  # prechunked: the files in a seeded order per epoch (shuffle_input_filenames)


SAMPLING_MODES = {
    "documents_random": SamplingMode(prechunked=False, random_offset=True),
    "documents_fixed": SamplingMode(prechunked=False),
    "chunks": SamplingMode(prechunked=True),
    "sequential": SamplingMode(prechunked=True, seeded_file_order=True),  # GPT-Neo's sequential_input
}

# GPT-Neo's input functions (the config's `input_fn`), each with the sampling modes it reads; the first is the
# mode of a dataset entry that names none. Without input_fn, a bare dataset id is read by sequential_input
# (GPT-Neo's default) and an [id, stitch, mode, weight] list by generic_text (as in this project's configs).
INPUT_FNS = {"sequential_input": ("sequential",), "generic_text": ("documents_random", "documents_fixed", "chunks")}


def check_input_fn(cfg: GPTConfig) -> None:
    """input_fn names one of INPUT_FNS, and reads the sampling mode of every dataset (the config check,
    config.py, runs this)."""
    if cfg.input_fn is None:
        return
    if cfg.input_fn not in INPUT_FNS:
        raise ConfigError(f"input_fn {cfg.input_fn!r} is not known: choose from {', '.join(INPUT_FNS)}"
                          f"{closest(cfg.input_fn, INPUT_FNS)}")
    for use in cfg.datasets:
        if use.sampling_mode not in INPUT_FNS[cfg.input_fn]:
            hint = ("remove input_fn (or set it to generic_text) to sample documents, or read pre-chunked data "
                    "with a bare id" if cfg.input_fn == "sequential_input" else
                    "remove input_fn (or set it to sequential_input) to read it sequentially")
            reads = ", ".join(INPUT_FNS[cfg.input_fn])
            raise ConfigError(f"dataset {use.dataset.id!r} asks for sampling mode {use.sampling_mode!r}, which "
                              f"input_fn {cfg.input_fn!r} does not read (it reads {reads}): {hint}")


# ----------------------------------------------------------------------------- stateless hash

def _hash_np(*values) -> np.ndarray:
    """Integer hash of the broadcast ``values`` (non-negative ints < 2**62) into [0, 2**31 - 1)."""
    state = np.full(np.broadcast(*[np.asarray(v) for v in values]).shape, 0x2545F491 % _PRIME, dtype=np.int64)
    for value in values:
        value = np.asarray(value, dtype=np.int64)
        for part in (value % _PRIME, value // _PRIME):
            state = _mix_np(np.bitwise_xor(state, part))
    return state


def _mix_np(state: np.ndarray) -> np.ndarray:
    for multiplier in _MULTIPLIERS:
        state = (state * multiplier) % _PRIME
        state = np.bitwise_xor(state, np.right_shift(state, 13))
    return state


def _hash_tf(*values) -> tf.Tensor:
    """The graph twin of ``_hash_np``: same inputs, same outputs. The leading plain integers (the seed, a stream's
    tag and domain) are folded in numpy: the state they leave is a constant, and only the tensors after them are
    mixed by ops (five a multiplier, three multipliers, two parts a value: the graph of a file order's hash 150 ->
    60 ops, built in every pipeline's functions)."""
    lead = 0
    while lead < len(values) and isinstance(values[lead], (int, np.integer)):
        lead += 1
    folded = int(_hash_np(*values[:lead])) if lead else 0x2545F491 % _PRIME
    if lead == len(values):
        return tf.constant(folded, tf.int64)
    tensors = [tf.cast(v, tf.int64) for v in values[lead:]]
    shape = tf.shape(tensors[0])
    for tensor in tensors[1:]:
        shape = tf.broadcast_dynamic_shape(shape, tf.shape(tensor))
    state = tf.fill(shape, tf.constant(folded, tf.int64))
    for value in tensors:
        for part in (value % _PRIME, value // _PRIME):
            state = _mix_tf(tf.bitwise.bitwise_xor(state, part))
    return state


def _mix_tf(state: tf.Tensor) -> tf.Tensor:
    for multiplier in _MULTIPLIERS:
        state = (state * multiplier) % _PRIME
        state = tf.bitwise.bitwise_xor(state, tf.bitwise.right_shift(state, tf.constant(13, tf.int64)))
    return state


# ----------------------------------------------------------------------------- files

@dataclass(frozen=True)
class _FileTable:
    """The tfrecord files of one glob, in natural order, with their example counts."""

    pattern: str
    paths: tuple
    counts: tuple

    @property
    def total(self) -> int:
        return sum(self.counts)


_COUNTED_NAME = re.compile(r"_(\d+)_(\d+)\.tfrecords$")
_validated_files: dict = {}


def _natural_key(path: str) -> list:
    """Sort ``x_2_...`` before ``x_10_...``: the order the files were written in."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path)]


def _list_files(pattern: str) -> _FileTable:
    """Resolve a glob and get each file's example count, validating the files' framing."""
    if not pattern:
        raise DataError("empty tfrecords path: set path/eval_path in the dataset config")
    paths = sorted(tf.io.gfile.glob(pattern), key=_natural_key)
    if not paths:
        raise DataError(f"no tfrecords files match {pattern}")
    counts = tuple(_validated_count(path) for path in paths)
    table = _FileTable(pattern, tuple(paths), counts)
    if table.total == 0:
        raise DataError(f"the tfrecords files matching {pattern} hold no examples")
    return table


def _validated_count(path: str) -> int:
    """Number of records in ``path``, checked against the count in its name when it has one.

    Local files are walked record header by record header (12 bytes read per record), which
    catches truncated files up front, naming them, instead of as a DataLossError deep inside
    training. Results are cached per (path, size, mtime).
    """
    named = _COUNTED_NAME.search(os.path.basename(path))
    if not os.path.exists(path):  # remote (gs://...) files: trust the name, else count by reading
        return int(named.group(2)) if named else _count_by_reading(path)
    stat = os.stat(path)
    key = (path, stat.st_size, stat.st_mtime_ns)
    if key not in _validated_files:
        walked = _walk_record_headers(path, stat.st_size)
        if named and int(named.group(2)) != walked:
            raise DataError(f"{path} holds {walked} records but its name says {named.group(2)}: the file was changed or truncated; recreate it")
        _validated_files[key] = walked
    return _validated_files[key]


def _walk_record_headers(path: str, size: int) -> int:
    """Count the records of a TFRecord file by following its length fields."""
    records = 0
    with open(path, "rb") as handle:
        position = 0
        while position < size:
            header = handle.read(12)
            if len(header) < 12:
                raise DataError(f"corrupt tfrecords file {path}: truncated record header at byte {position}")
            (length,) = struct.unpack("<Q", header[:8])
            position += 12 + length + 4
            if position > size and records == 0 and not _length_checksum_holds(path):
                raise DataError(f"{path} is not a TFRecord file (its first bytes are no record header): pass the "
                                f"tfrecords files data/create_tfrecords.py writes, or move this file out of the glob")
            if position > size:
                raise DataError(f"corrupt tfrecords file {path}: record {records} at byte {position - length - 16} needs {length} bytes but the file ends at {size} (truncated?)")
            handle.seek(position)
            records += 1
    return records


def _length_checksum_holds(path: str) -> bool:
    """Whether the first record header's length has its checksum (TF's reader checks it before reading the
    record): a text file named .tfrecords fails it, a TFRecord file cut short passes."""
    try:
        next(iter(_iterate_records(path, 1)), None)
    except DataError as error:
        return "corrupted record at 0" not in str(error)
    return True


def _count_by_reading(path: str) -> int:
    return sum(1 for _ in _iterate_records(path))


def _iterate_records(path: str, limit: Optional[int] = None):
    """Serialized records of one file, via TF's CRC-checking reader; corruption -> DataError."""
    try:
        quiet = silenced_deprecation() if silenced_deprecation else contextlib.nullcontext()
        with quiet:  # tf_record_iterator is the reader that works in graph and eager mode alike
            iterator = tf.compat.v1.io.tf_record_iterator(path)
        for number, record in enumerate(iterator):
            if limit is not None and number >= limit:
                return
            yield record
    except tf.errors.DataLossError as exc:
        raise DataError(f"corrupt tfrecords file {path}: {exc.message.splitlines()[0] if exc.message else 'data loss'}") from exc
    except tf.errors.NotFoundError as exc:
        raise DataError(f"tfrecords file not found: {path}") from exc


def _record_tokens(record: bytes, path: str) -> list:
    example = tf.train.Example.FromString(record)
    if "text" not in example.features.feature:
        raise DataError(f"{path} has examples without the int64 feature 'text'; was it made by data/create_tfrecords.py?")
    return list(example.features.feature["text"].int64_list.value)


# ----------------------------------------------------------------------------- statistics

def first_document_tokens(path: str, count: int) -> list:
    """The first `count` token ids of the first document of the tfrecords matching `path` (files in sorted
    order), read as token_stats reads them."""
    for file_path in _list_files(path).paths:
        for record in _iterate_records(file_path, 1):
            return _record_tokens(record, file_path)[:count]
    return []


def token_stats(path: str, max_records: int | None = None) -> dict:
    """Token id range, document and token counts of the tfrecords matching ``path``.

    Reads with TF's CRC-checking reader, so corruption anywhere read surfaces here as a
    DataError naming the file. ``max_records`` bounds the work for a quick check.
    """
    table = _list_files(path)
    stats = {"files": len(table.paths), "documents": 0, "tokens": 0, "min_token_id": None, "max_token_id": None,
             "min_document_tokens": None, "max_document_tokens": None}
    for file_path in table.paths:
        remaining = None if max_records is None else max_records - stats["documents"]
        if remaining is not None and remaining <= 0:
            break
        for record in _iterate_records(file_path, remaining):
            tokens = _record_tokens(record, file_path)
            stats["documents"] += 1
            stats["tokens"] += len(tokens)
            stats["min_document_tokens"] = _smaller(stats["min_document_tokens"], len(tokens))
            stats["max_document_tokens"] = _larger(stats["max_document_tokens"], len(tokens))
            if tokens:
                stats["min_token_id"] = _smaller(stats["min_token_id"], min(tokens))
                stats["max_token_id"] = _larger(stats["max_token_id"], max(tokens))
    return stats


def _smaller(current, value):
    return value if current is None else min(current, value)


def _larger(current, value):
    return value if current is None else max(current, value)


# ----------------------------------------------------------------------------- training data

def check_train_sources(sources: list[DatasetSource], n_ctx: int, batch_size: int, seed: int, start_step: int = 0,
                        n_vocab: Optional[int] = None) -> list:
    """train_dataset's checks at build time, without building it: the arguments, every source's files (their
    framing), and its first documents (windows of n_ctx+1 tokens from `stitch` documents, ids below n_vocab).
    A DataError naming the fix; else the sources' file tables."""
    _check_train_arguments(sources, n_ctx, batch_size, seed, start_step)
    tables = [_list_files(source.path) for source in sources]
    for source, table in zip(sources, tables):
        _check_first_documents(source, table, n_ctx + 1, n_vocab)
    return tables


def train_dataset(sources: list[DatasetSource], n_ctx: int, batch_size: int, seed: int, start_step: int = 0,
                  n_vocab: Optional[int] = None) -> tf.data.Dataset:
    """Infinite batches of (inputs, labels), int32 [batch_size, n_ctx], labels = inputs shifted by one.

    The same arguments always give the same batches, and ``start_step=s`` gives exactly the
    batches an uninterrupted run gives from batch ``s`` on. With ``n_vocab`` (the model's),
    a token id outside [0, n_vocab) is an error (at build time if the first documents show
    one, else when its batch is read: see ``pipeline_error``) instead of a silent wrong
    embedding lookup.
    """
    tables = check_train_sources(sources, n_ctx, batch_size, seed, start_step, n_vocab)
    window = n_ctx + 1
    first_example = start_step * batch_size
    examples_before = _examples_taken_per_source(sources, seed, first_example)
    streams = [
        _source_windows(source, table, window, seed, _source_tag(index, source), skip_examples)
        for index, (source, table, skip_examples) in enumerate(zip(sources, tables, examples_before))
    ]
    if len(streams) == 1:
        windows = streams[0]
    else:
        thresholds = _choice_thresholds(sources)
        choices = tf.data.Dataset.range(first_example, _FOREVER).map(_plain(lambda j: _choose_source_tf(seed, j, thresholds)))
        windows = tf.data.Dataset.choose_from_datasets(streams, choices)
    return _to_batches(windows, batch_size, n_ctx, n_vocab, ", ".join(source.path for source in sources))


def _check_train_arguments(sources, n_ctx, batch_size, seed, start_step) -> None:
    if not sources:
        raise DataError("no training datasets: the config's \"datasets\" list is empty")
    if n_ctx < 1 or batch_size < 1:
        raise DataError(f"n_ctx and batch_size must be >= 1, got n_ctx={n_ctx}, batch_size={batch_size}")
    if start_step < 0 or seed < 0:
        raise DataError(f"seed and start_step must be >= 0, got seed={seed}, start_step={start_step}")
    for source in sources:
        if source.sampling_mode not in SAMPLING_MODES:
            raise DataError(f"unknown sampling mode {source.sampling_mode!r} for {source.path}; use one of {', '.join(SAMPLING_MODES)}")
        if not SAMPLING_MODES[source.sampling_mode].prechunked and (not isinstance(source.stitch, int) or source.stitch < 1):
            raise DataError(f"stitch must be an integer >= 1 for {source.path}, got {source.stitch!r}")
        if not source.weight > 0:
            raise DataError(f"dataset weight must be > 0 for {source.path}, got {source.weight!r}")


def _check_first_documents(source: DatasetSource, table: _FileTable, window: int, n_vocab: Optional[int]) -> None:
    """Refuse settings that cannot give full windows, and ids beyond n_vocab, judged from the first documents.

    The graph also asserts both for every window, but an error at build time, naming the
    fix, is far kinder than one after the model has been compiled.
    """
    first_file = next(path for path, count in zip(table.paths, table.counts) if count)
    documents = [_record_tokens(record, first_file) for record in _iterate_records(first_file, SAMPLE_DOCUMENTS_FOR_CHECKS)]
    if n_vocab is not None:
        ids = [token for tokens in documents for token in tokens]
        if ids and not 0 <= min(ids) <= max(ids) < n_vocab:
            bad = max(ids) if max(ids) >= n_vocab else min(ids)
            raise DataError(f"{first_file} holds token id {bad}, outside the model's vocabulary (0 <= id < n_vocab = {n_vocab}): "
                            f"it was encoded with another tokenizer; raise n_vocab or re-encode the data")
    shortest = min(len(tokens) for tokens in documents)
    if SAMPLING_MODES[source.sampling_mode].prechunked:
        if shortest < window:
            documents_instead = (' (or, for tfrecords of whole documents, write the dataset as [ID, stitch, "documents_random", '
                                 '1.0] in the model config)' if source.sampling_mode == "sequential" else "")
            raise DataError(f"{first_file} holds chunks of {shortest} tokens but n_ctx+1 = {window} are needed; recreate it "
                            f"with --mode chunks --n_ctx {window - 1}{documents_instead}")
        if shortest > window:
            print(f"warning: {first_file} holds chunks of {shortest} or more tokens; {source.sampling_mode} mode trains on the "
                  f"first n_ctx+1 = {window} of each (as GPT-Neo's sequential_input did) and skips the rest: recreate the "
                  f"tfrecords with --mode chunks --n_ctx {window - 1} to use all of them", file=sys.stderr)
    elif source.stitch * shortest < window:
        raise DataError(
            f"stitch {source.stitch} * shortest document ({shortest} tokens, in {first_file}) < n_ctx+1 = {window}: "
            f"raise stitch to {-(-window // shortest)} or recreate the tfrecords with --minimum_size >= {-(-window // source.stitch)}"
        )


def _source_tag(index: int, source: DatasetSource) -> int:
    """A per-source hash input so two sources never share random decisions: the glob's file pattern and the
    source's place in the list, not its folder, so that data moved elsewhere (a clone in another folder, a run
    continued on a host with another home directory) gives the same batches."""
    return (zlib.crc32(os.path.basename(source.path).encode("utf-8")) * 1000 + index) % _PRIME


def _choice_thresholds(sources: list[DatasetSource]) -> list:
    """Integer cut points in [0, 2**31-1): source i is chosen when the hash falls in its slice."""
    total = float(sum(source.weight for source in sources))
    cumulative = np.cumsum([source.weight / total for source in sources])[:-1]
    return [int(round(fraction * _PRIME)) for fraction in cumulative]


def _choose_source_tf(seed: int, example_index: tf.Tensor, thresholds: list) -> tf.Tensor:
    draw = _hash_tf(seed, _SOURCE_CHOICE, example_index)
    return tf.reduce_sum(tf.cast(draw >= tf.constant(thresholds, tf.int64), tf.int64))


def _examples_taken_per_source(sources: list[DatasetSource], seed: int, examples: int) -> list:
    """How many examples each source contributed to the first ``examples`` mixed examples."""
    if len(sources) == 1:
        return [examples]
    thresholds = np.asarray(_choice_thresholds(sources), dtype=np.int64)
    taken = np.zeros(len(sources), dtype=np.int64)
    block = 1 << 20
    for start in range(0, examples, block):
        indices = np.arange(start, min(start + block, examples), dtype=np.int64)
        choices = (_hash_np(seed, _SOURCE_CHOICE, indices)[:, None] >= thresholds[None, :]).sum(axis=1)
        taken += np.bincount(choices, minlength=len(sources))
    return [int(count) for count in taken]


def _source_windows(source: DatasetSource, table: _FileTable, window: int, seed: int, tag: int, skip_examples: int) -> tf.data.Dataset:
    """Infinite stream of int64 [window] examples of one source, starting at example ``skip_examples``."""
    mode = SAMPLING_MODES[source.sampling_mode]
    if mode.prechunked:
        shuffle = mode.seeded_file_order and source.shuffle_files
        records = _records_from(table, skip_examples, seed, tag, shuffle_files=shuffle)
        return records.map(_plain(lambda record: _first_tokens(_parse_tokens(record), window, source)),
                           num_parallel_calls=tf.data.AUTOTUNE)

    first_document = skip_examples * source.stitch
    first_block = first_document // SHUFFLE_BLOCK_DOCUMENTS
    records = _records_from(table, first_block * SHUFFLE_BLOCK_DOCUMENTS, seed, tag, shuffle_files=True)
    blocks = tf.data.Dataset.zip((records.batch(SHUFFLE_BLOCK_DOCUMENTS), tf.data.Dataset.range(first_block, _FOREVER)))
    shuffled = blocks.map(_plain(lambda block, index: _shuffle_block(block, index, seed, tag)),
                          num_parallel_calls=tf.data.AUTOTUNE)
    documents = shuffled.unbatch().skip(first_document - first_block * SHUFFLE_BLOCK_DOCUMENTS)
    documents = documents.map(_plain(_parse_tokens), num_parallel_calls=tf.data.AUTOTUNE)
    groups = documents.ragged_batch(source.stitch).map(_plain(lambda group: group.flat_values))
    numbered = tf.data.Dataset.zip((groups, tf.data.Dataset.range(skip_examples, _FOREVER)))
    random_offset = mode.random_offset
    return numbered.map(
        _plain(lambda tokens, index: _window_of_group(tokens, index, window, seed, tag, random_offset, source)),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def _epoch_file_order_np(n_files: int, seed: int, tag: int, epoch: int) -> np.ndarray:
    keys = _hash_np(seed, tag, _FILE_ORDER, epoch, np.arange(n_files, dtype=np.int64))
    return np.argsort(keys, kind="stable")


def _epoch_file_order_tf(n_files: int, seed: int, tag: int, epoch: tf.Tensor) -> tf.Tensor:
    keys = _hash_tf(seed, tag, _FILE_ORDER, epoch, tf.range(n_files, dtype=tf.int64))
    return tf.argsort(keys, stable=True)


def _records_from(table: _FileTable, first_record: int, seed: int, tag: int, shuffle_files: bool) -> tf.data.Dataset:
    """Serialized records of the endless epoch sequence, starting at record ``first_record``.

    Each epoch visits every file once, in a seeded order (or in sorted order); the
    start is found from the per-file counts, so whole files before it are never opened.
    """
    counts = np.asarray(table.counts, dtype=np.int64)
    epoch, offset = divmod(first_record, table.total)
    n_files = len(table.paths)
    order = _epoch_file_order_np(n_files, seed, tag, epoch) if shuffle_files else np.arange(n_files)
    ends = np.cumsum(counts[order])
    first_position = int(np.searchsorted(ends, offset, side="right"))
    skip_in_file = offset - (int(ends[first_position - 1]) if first_position else 0)
    paths = tf.constant(list(table.paths))
    first_paths = [table.paths[i] for i in order[first_position:]]
    first_skips = [skip_in_file] + [0] * (len(first_paths) - 1)
    first_epoch = tf.data.Dataset.from_tensor_slices((tf.constant(first_paths), tf.constant(first_skips, tf.int64)))

    def epoch_files(epoch_index):
        epoch_order = _epoch_file_order_tf(n_files, seed, tag, epoch_index) if shuffle_files else tf.range(n_files)
        return tf.data.Dataset.from_tensor_slices((tf.gather(paths, epoch_order), tf.zeros([n_files], tf.int64)))

    later_epochs = tf.data.Dataset.range(epoch + 1, _FOREVER).flat_map(_plain(epoch_files))
    return first_epoch.concatenate(later_epochs).flat_map(_plain(lambda path, skip: tf.data.TFRecordDataset(path).skip(skip)))


def _shuffle_block(block: tf.Tensor, block_index: tf.Tensor, seed: int, tag: int) -> tf.Tensor:
    keys = _hash_tf(seed, tag, _BLOCK_SHUFFLE, block_index, tf.range(tf.size(block, out_type=tf.int64), dtype=tf.int64))
    return tf.gather(block, tf.argsort(keys, stable=True))


def _parse_tokens(record: tf.Tensor) -> tf.Tensor:
    parsed = tf.io.parse_single_example(record, {"text": tf.io.VarLenFeature(tf.int64)})
    return parsed["text"].values


PIPELINE_ERROR_TAG = "input pipeline: "  # starts the message of every assertion the graph makes on the data


_RECORD_CORRUPTION = re.compile(r"(corrupted|truncated) record at \d+")


def pipeline_error(error: tf.errors.OpError) -> Optional[DataError]:
    """The DataError behind an in-graph failure of this pipeline, or None if ``error`` is another failure.

    Problems found while training reads the data (a short stitched group, a token id beyond
    n_vocab, a record whose checksum fails) surface from the training session as
    InvalidArgumentError / DataLossError with TF's long message; callers turn them back into
    the one-line error the user should see.
    """
    message = error.message or ""
    corruption = _RECORD_CORRUPTION.search(message)
    if isinstance(error, tf.errors.DataLossError) and corruption:
        return DataError(f"a tfrecords file is corrupt ({corruption.group(0)}, found while reading it); "
                         f"--check_dataset names the file: recreate it")
    if PIPELINE_ERROR_TAG not in message:
        return None
    text = message[message.index(PIPELINE_ERROR_TAG) + len(PIPELINE_ERROR_TAG):]
    for end in ("] [", "]\n", "\n"):  # TF's assert message is "assertion failed: [ours] [Condition ...] ..."
        if end in text:
            text = text[:text.index(end)]
    return DataError(text.rstrip("]").replace("\\'", "'").strip())


def _assert_long_enough(tokens: tf.Tensor, window: int, source: DatasetSource) -> tf.Tensor:
    what = "a chunk" if SAMPLING_MODES[source.sampling_mode].prechunked else f"a stitched group of {source.stitch} documents"
    return tf.debugging.assert_greater_equal(
        tf.size(tokens, out_type=tf.int64), tf.constant(window, tf.int64),
        message=f"{PIPELINE_ERROR_TAG}{what} from {source.path} has fewer than n_ctx+1 = {window} tokens; raise stitch or recreate the tfrecords with a larger --minimum_size",
    )


def _first_tokens(tokens: tf.Tensor, window: int, source: DatasetSource) -> tf.Tensor:
    with tf.control_dependencies([_assert_long_enough(tokens, window, source)]):
        return tf.ensure_shape(tokens[:window], [window])


def _window_of_group(tokens, group_index, window, seed, tag, random_offset, source) -> tf.Tensor:
    with tf.control_dependencies([_assert_long_enough(tokens, window, source)]):
        if random_offset:
            choices = tf.size(tokens, out_type=tf.int64) - window + 1
            offset = _hash_tf(seed, tag, _WINDOW_OFFSET, group_index) % tf.maximum(choices, 1)
        else:
            offset = tf.constant(0, tf.int64)
        return tf.ensure_shape(tokens[offset:offset + window], [window])


def _to_batches(windows: tf.data.Dataset, batch_size: int, n_ctx: int, n_vocab: Optional[int], what: str) -> tf.data.Dataset:
    def split(batch):
        if n_vocab is not None:
            in_range = tf.logical_and(tf.reduce_min(batch) >= 0, tf.reduce_max(batch) < n_vocab)
            message = (f"{PIPELINE_ERROR_TAG}a batch from {what} holds a token id outside the model's vocabulary "
                       f"(0 <= id < n_vocab = {n_vocab}): the data was encoded with another tokenizer; raise n_vocab or re-encode the data")
            with tf.control_dependencies([tf.debugging.Assert(in_range, [message])]):
                batch = tf.identity(batch)
        batch = tf.cast(batch, tf.int32)
        return tf.ensure_shape(batch[:, :-1], [batch_size, n_ctx]), tf.ensure_shape(batch[:, 1:], [batch_size, n_ctx])

    return windows.batch(batch_size, drop_remainder=True).map(_plain(split)).prefetch(tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------- evaluation data

def eval_dataset(path: str, n_ctx: int, batch_size: int, n_vocab: Optional[int] = None) -> tf.data.Dataset:
    """Finite, ordered batches: all documents stitched in file order, cut into n_ctx+1 windows.

    The last partial window and partial batch are dropped (static shapes); DataError if the
    data cannot fill a single batch. ``n_vocab`` checks token ids as in ``train_dataset``.
    """
    batches = eval_batches(path, n_ctx, batch_size)
    if batches == 0:
        stats = token_stats(path)
        raise DataError(f"eval data {path} has {stats['tokens']} tokens, fewer than one batch of {batch_size} windows of n_ctx+1 = {n_ctx + 1}")
    table = _list_files(path)
    window = n_ctx + 1
    documents = tf.data.Dataset.from_tensor_slices(list(table.paths)).flat_map(tf.data.TFRecordDataset).map(_plain(_parse_tokens))

    def cut(carry, document):
        stream = tf.concat([carry, document], axis=0)
        complete = tf.size(stream) // window * window
        return stream[complete:], tf.reshape(stream[:complete], [-1, window])

    windows = documents.scan(tf.zeros([0], tf.int64), _plain(cut)).unbatch()
    return _to_batches(windows, batch_size, n_ctx, n_vocab, path)


def eval_batches(path: str, n_ctx: int, batch_size: int) -> int:
    """Number of batches ``eval_dataset`` yields (reads the data once; cheap for eval sets)."""
    if n_ctx < 1 or batch_size < 1:
        raise DataError(f"n_ctx and batch_size must be >= 1, got n_ctx={n_ctx}, batch_size={batch_size}")
    return token_stats(path)["tokens"] // (n_ctx + 1) // batch_size
