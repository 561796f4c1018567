"""Tokenize text into tfrecord files for training, the way GPT-Neo's script did, but resumable.

Every example is one int64 feature named ``text``:

* ``--mode documents``: one example per document, with the separator appended, for the
  ``documents_random`` / ``documents_fixed`` sampling modes;
* ``--mode chunks``: the documents (each followed by the separator) are concatenated and cut
  into fixed windows of ``n_ctx + 1`` tokens, for the ``chunks`` sampling mode.

The input documents are split into consecutive groups of ``--files_per`` documents in
sorted-file order; group ``i`` becomes ``{name}_{i}_{N}.tfrecords`` where N is the number of
examples in it (the input pipeline uses N to skip whole files when resuming training). A
group whose documents are all discarded writes no file. Because the grouping depends only on
the inputs, a rerun keeps the files that are finished and redoes the others; a manifest
(``{name}.manifest.json``) records the settings so a rerun with different ones is refused
instead of silently mixing two datasets. Files are written under a temporary name and
renamed when complete, so a crash never leaves a truncated ``.tfrecords`` behind.
Chunks mode cuts each group on its own (again for resumability); the last partial window of
each group is dropped and counted.

Example:

    python -m data.create_tfrecords --mode documents --input_dir <base> --name <name> \
        --output_dir <output> --encoder_path data/tokenizers/stdlib-bpe-4096.json --minimum_size 100
"""

from __future__ import annotations

import argparse
import errno
import glob as globlib
import hashlib
import json
import os
import re
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Iterable, Iterator, Optional, Sequence

if __package__ in (None, ""):  # allow `python data/create_tfrecords.py` as well as `-m`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tqdm import tqdm

import modelpath.files
from console.arguments import ArgumentParser
from schema import DATASET_CONFIG_DIR as DEFAULT_DATASET_CONFIG_DIR, REPO_ROOT
from data.documents import Document, check_whole, iter_documents, list_input_files
from data.errors import DataError
from data.tokenizer import LoadedTokenizer, load_tokenizer
from data.workers import WorkerLost, Workers

MODES = ("documents", "chunks")
ENCODE_BATCH_DOCUMENTS = 64  # documents tokenized per call: small enough for a lively progress bar
TEMPORARY_SUFFIX = ".tmp"


@dataclass
class Summary:
    """What a run did; ``line()`` is the one-line report printed at the end."""

    documents_read: int = 0
    discarded_short: int = 0
    undecodable: int = 0
    documents_written: int = 0
    examples_written: int = 0
    tokens_written: int = 0
    chunk_tail_tokens_dropped: int = 0
    files_written: int = 0
    files_kept: int = 0
    documents_in_kept_files: int = 0
    undecodable_sources: list = field(default_factory=list)
    output_files: list = field(default_factory=list)

    def add(self, other: "Summary") -> None:
        for name, value in asdict(other).items():
            if isinstance(value, int):
                setattr(self, name, getattr(self, name) + value)
        self.undecodable_sources.extend(other.undecodable_sources)
        self.output_files.extend(other.output_files)

    def line(self) -> str:
        text = (
            f"documents read {self.documents_read} / discarded (too short) {self.discarded_short} / "
            f"undecodable {self.undecodable} / written {self.documents_written}, "
            f"examples {self.examples_written}, tokens {self.tokens_written}, files {self.files_written}"
        )
        if self.files_kept:
            text += f" (+{self.files_kept} kept from a previous run, {self.documents_in_kept_files} documents)"
        if self.chunk_tail_tokens_dropped:
            text += f", chunk tail tokens dropped {self.chunk_tail_tokens_dropped}"
        return text


@dataclass(frozen=True)
class EncodingSettings:
    """Everything that decides the content of an output file; recorded in the manifest."""

    mode: str
    separator: tuple
    minimum_size: int
    n_ctx: int
    files_per: int
    name: str


def create_tfrecords(
    input_dir: str,
    output_dir: str,
    name: str,
    mode: str = "documents",
    encoder_path: Optional[str] = None,
    use_gpt2_tokenizer: bool = False,
    gpt2_tokenizer_path: str = "gpt2",
    separator: Optional[Sequence[int]] = None,
    minimum_size: int = 100,
    files_per: int = 100000,
    processes: int = 1,
    n_ctx: int = 2048,
    glob: Optional[str] = None,
    show_progress: bool = True,
    tokenizer: Optional[LoadedTokenizer] = None,
    files: Optional[Sequence[str]] = None,
) -> Summary:
    """Tokenize every document under ``input_dir`` into ``output_dir/{name}_{i}_{N}.tfrecords``.

    Returns the run's Summary. Raises DataError (and leaves no new output file) for bad
    input: missing/empty folder, glob matching nothing, a truncated archive, missing tokenizer, invalid settings,
    or when no document survives (all undecodable or all shorter than ``minimum_size``).
    ``tokenizer`` (one already loaded) replaces the three tokenizer arguments; ``files`` (some of
    ``input_dir``'s, e.g. a held-out part) replaces listing it.
    """
    _check_settings(mode, name, minimum_size, files_per, processes, n_ctx)
    if tokenizer is None:
        tokenizer = _load_chosen_tokenizer(encoder_path, use_gpt2_tokenizer, gpt2_tokenizer_path)
    settings = EncodingSettings(mode, _check_separator(separator, tokenizer), minimum_size, n_ctx if mode == "chunks" else 0, files_per, name)
    files = list(files) if files is not None else list_input_files(input_dir, glob)
    check_whole(files)  # a cut archive is refused before anything is written, not found half-way through
    made = _first_missing_folder(output_dir)
    _make_output_dir(output_dir)
    try:
        return _encode(files, output_dir, settings, tokenizer, processes, input_dir, show_progress)
    except BaseException:  # a refusal or an interruption: the folders this run made go again if they stayed empty
        if made is not None:
            _remove_empty_folders(output_dir, made)
        raise


def _encode(files: list, output_dir: str, settings: EncodingSettings, tokenizer: LoadedTokenizer, processes: int,
            input_dir: str, show_progress: bool) -> Summary:
    name = settings.name
    finished = _finished_files(output_dir, name)
    manifest_created = _check_or_write_manifest(output_dir, settings, tokenizer, files, finished)
    _remove_leftover_temporaries(output_dir, name)

    summary = Summary(files_kept=len(finished))
    try:
        with tqdm(desc=f"tokenizing {name}", unit="doc", disable=not show_progress, file=sys.stderr) as progress:
            for part in _process_groups(files, finished, tokenizer, settings, output_dir, processes, progress):
                summary.add(part)
    except BaseException:
        _remove_leftover_temporaries(output_dir, name)
        if manifest_created and not _finished_files(output_dir, name):
            os.remove(_manifest_path(output_dir, name))
        raise
    if summary.files_written == 0 and summary.files_kept == 0:
        if manifest_created:
            os.remove(_manifest_path(output_dir, name))
        raise DataError(_nothing_written_message(summary, settings, input_dir))
    if summary.undecodable:
        examples = ", ".join(summary.undecodable_sources[:3])
        print(f"warning: skipped {summary.undecodable} undecodable (not UTF-8) documents, e.g. {examples}", file=sys.stderr)
    return summary


def _check_settings(mode: str, name: str, minimum_size: int, files_per: int, processes: int, n_ctx: int) -> None:
    if mode not in MODES:
        raise DataError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not name or os.sep in name or name.startswith("."):
        raise DataError(f"--name must be a plain file name prefix, got {name!r}")
    if minimum_size < 0:
        raise DataError(f"--minimum_size must be >= 0, got {minimum_size}")
    if files_per < 1:
        raise DataError(f"--files_per must be >= 1, got {files_per}")
    if processes < 1:
        raise DataError(f"--processes must be >= 1, got {processes}")
    if mode == "chunks" and n_ctx < 1:
        raise DataError(f"--n_ctx must be >= 1 in chunks mode, got {n_ctx}")


def _load_chosen_tokenizer(encoder_path: Optional[str], use_gpt2: bool, gpt2_path: str) -> LoadedTokenizer:
    if use_gpt2:
        return load_tokenizer(gpt2_path or "gpt2", pretrained=True)
    if not encoder_path:
        raise DataError("no tokenizer: pass --encoder_path <tokenizer json> or --use_gpt2_tokenizer")
    return load_tokenizer(encoder_path)


def _check_separator(separator: Optional[Sequence[int]], tokenizer: LoadedTokenizer) -> tuple:
    """The separator ids; defaults to [eos_id]. Ids outside the vocabulary are refused."""
    if separator is None:
        if tokenizer.eos_id is None:
            raise DataError(f"tokenizer {tokenizer.path} has no <|endoftext|> token; pass --separator as a JSON list of ids")
        return (tokenizer.eos_id,)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in separator):
        raise DataError(f"--separator must be a JSON list of integer token ids, got {list(separator)!r}")
    out_of_range = [i for i in separator if not 0 <= i < tokenizer.vocab_size]
    if out_of_range:
        raise DataError(f"--separator ids {out_of_range} are outside the tokenizer's vocabulary (size {tokenizer.vocab_size})")
    return tuple(separator)


# ----------------------------------------------------------------------------- output files

OUTPUT_FILE = re.compile(r"^(.+)_\d+_\d+\.tfrecords$")  # output_file_name's: group 1 is the name


def output_file_name(name: str, index: int, examples: int) -> str:
    """``{name}_{index}_{examples}.tfrecords``: the count lets readers skip files without opening them."""
    return f"{name}_{index}_{examples}.tfrecords"


def _temporary_path(output_dir: str, name: str, index: int) -> str:
    return os.path.join(output_dir, f"{name}_{index}.tfrecords{TEMPORARY_SUFFIX}")


def _finished_files(output_dir: str, name: str) -> dict:
    """Group index -> path of each completed output file of ``name`` in ``output_dir``."""
    pattern = re.compile(rf"^{re.escape(name)}_(\d+)_(\d+)\.tfrecords$")
    finished: dict = {}
    for entry in sorted(os.listdir(output_dir)):
        match = pattern.match(entry)
        if not match:
            continue
        index = int(match.group(1))
        if index in finished:
            raise DataError(f"{output_dir} holds two files for group {index} of {name!r}: {os.path.basename(finished[index])} and {entry}")
        finished[index] = os.path.join(output_dir, entry)
    return finished


def _first_missing_folder(path: str) -> Optional[str]:
    """The outermost folder of `path` that does not exist yet (the first makedirs would create), or None."""
    path = os.path.abspath(path)
    missing = None
    while not os.path.exists(path):
        missing = path
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def _remove_empty_folders(output_dir: str, outermost: str) -> None:
    """Removes output_dir and its parents up to `outermost` while they are empty."""
    folder = os.path.abspath(output_dir)
    while True:
        try:
            os.rmdir(folder)  # only an empty folder
        except OSError:
            return
        if folder == outermost:
            return
        folder = os.path.dirname(folder)


def _make_output_dir(output_dir: str) -> None:
    """Creates --output_dir; a file in its place (or in place of a parent folder) is a DataError naming it."""
    try:
        os.makedirs(output_dir, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = output_dir
        while os.path.dirname(blocker) != blocker and not os.path.isfile(blocker):
            blocker = os.path.dirname(blocker)
        where = "" if blocker == output_dir else f"cannot be created: {blocker} "
        raise DataError(f"--output_dir {output_dir} {where}is a file, not a folder: choose another --output_dir "
                        f"(or move the file away)") from None
    except OSError as exc:
        raise DataError(f"--output_dir {output_dir} cannot be created ({exc.strerror}): choose another --output_dir") from None


def _remove_leftover_temporaries(output_dir: str, name: str) -> None:
    """Delete half-written files of a crashed run; their groups are then redone."""
    # a manifest's temporary as write_atomically names it, or as versions before it did (`.manifest.json.tmp`)
    pattern = re.compile(rf"^{re.escape(name)}(_\d+\.tfrecords{re.escape(TEMPORARY_SUFFIX)}"
                         rf"|\.manifest\.json({modelpath.files.TEMPORARY_TAIL}|\.tmp))$")
    for entry in os.listdir(output_dir):
        if pattern.match(entry):
            os.remove(os.path.join(output_dir, entry))


def _manifest_path(output_dir: str, name: str) -> str:
    return os.path.join(output_dir, f"{name}.manifest.json")


def _check_or_write_manifest(output_dir: str, settings: EncodingSettings, tokenizer: LoadedTokenizer, files: list, finished: dict) -> bool:
    """Refuse to resume over files made with other settings; returns True if the manifest is new."""
    manifest = {
        "settings": asdict(settings) | {"separator": list(settings.separator)},
        "tokenizer_sha256": hashlib.sha256(tokenizer.backend.to_str().encode("utf-8")).hexdigest(),
        "inputs_sha256": hashlib.sha256(json.dumps([[path, os.path.getsize(path)] for path in files]).encode("utf-8")).hexdigest(),
        # What tools/hf.py compares with a model's tokenizer (without "from": a path is no part of a tokenizer).
        "tokenizer_id": {"sha256": tokenizer.tokenizer_id.sha256, "size": tokenizer.tokenizer_id.size},
    }
    path = _manifest_path(output_dir, settings.name)
    if os.path.exists(path):
        previous, problem = _read_manifest(path)
        if previous is not None and "tokenizer_id" not in previous:  # written before the record: resume over it
            manifest.pop("tokenizer_id")
        if problem and finished:
            raise DataError(
                f"{path} is corrupt ({problem}), so the {len(finished)} finished {settings.name!r} files in "
                f"{output_dir} cannot be resumed safely: delete them and the manifest (or the whole folder) to "
                f"start over, or choose another --output_dir/--name"
            )
        if previous != manifest and finished:
            raise DataError(
                f"{output_dir} holds {settings.name!r} files made with other settings, tokenizer or inputs "
                f"(see {path}); delete them or choose another --output_dir/--name"
            )
        if previous == manifest:
            return False
    elif finished:
        raise DataError(f"{output_dir} holds {settings.name!r} files but no manifest, so they cannot be resumed safely; delete them or choose another --output_dir/--name")
    write_json_atomically(path, manifest)
    return True


def read_manifest_tokenizer(output_dir: str, tokenizer: LoadedTokenizer):
    """Whether the files of output_dir's manifests were encoded with `tokenizer`: True, or the TokenizerId (or a
    description) of the tokenizer one of them records instead; None when the folder has no manifest to tell. A
    manifest written before the tokenizer_id record is compared by its hash of the tokenizer's JSON."""
    from schema import ConfigError, parse_tokenizer_id
    manifests = sorted(entry for entry in os.listdir(output_dir) if entry.endswith(".manifest.json"))
    if not manifests:
        return None
    for entry in manifests:
        manifest, problem = _read_manifest(os.path.join(output_dir, entry))
        if problem:
            return f"unknown ({entry} is damaged: {problem})"
        try:
            recorded = parse_tokenizer_id(manifest.get("tokenizer_id"), entry)
        except ConfigError as exc:
            return f"unknown ({exc})"
        if recorded is not None and not recorded.matches(tokenizer.tokenizer_id):
            return recorded
        if recorded is None and manifest["tokenizer_sha256"] != hashlib.sha256(tokenizer.backend.to_str().encode("utf-8")).hexdigest():
            return f"of JSON sha256 {manifest['tokenizer_sha256'][:12]} (per {entry})"
    return True


def manifest_tokenizers(files_glob: str) -> list:
    """[(manifest path, TokenizerId)]: the tokenizer each manifest of the files a glob matches records as having
    encoded them (`{name}_{i}_{N}.tfrecords` is described by `{name}.manifest.json` beside it), so a dataset
    config written by hand still says which tokenizer its data is. Local files only (a bucket's are not listed
    when a config is read); a manifest that is damaged, or written before the record, records nothing here."""
    from schema import ConfigError, parse_tokenizer_id
    if not files_glob or "://" in files_glob:
        return []
    manifests = set()
    for path in globlib.glob(files_glob):
        match = OUTPUT_FILE.match(os.path.basename(path))
        if match:
            manifests.add(_manifest_path(os.path.dirname(path), match.group(1)))
    found = []
    for path in sorted(manifests):
        if not os.path.isfile(path):
            continue
        try:
            manifest, problem = _read_manifest(path)
            recorded = None if problem else parse_tokenizer_id(manifest.get("tokenizer_id"), path)
        except (ConfigError, DataError):
            continue
        if recorded is not None:
            found.append((path, replace(recorded, source=path)))
    return found


def _read_manifest(path: str) -> tuple:
    """(the manifest, None), or (None, what is wrong with it) when it is not one this tool wrote."""
    try:
        with open(path, encoding="utf-8") as handle:
            previous = json.load(handle)
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    except OSError as exc:
        raise DataError(f"{path} cannot be read ({exc.strerror}): delete it, or choose another --output_dir/--name") from None
    if (not isinstance(previous, dict) or not isinstance(previous.get("settings"), dict)
            or not all(isinstance(previous.get(key), str) for key in ("tokenizer_sha256", "inputs_sha256"))):
        return None, "not a create_tfrecords manifest: it needs settings, tokenizer_sha256 and inputs_sha256"
    return previous, None


def write_json_atomically(path: str, payload: dict) -> None:
    """A manifest or dataset config, as users read them (indent 2), written whole (modelpath/files.py)."""
    modelpath.files.write_json_atomically(path, payload, indent=2)


# ----------------------------------------------------------------------------- encoding

def _groups(documents: Iterable[Document], files_per: int) -> Iterator[tuple]:
    """(index, documents) for consecutive groups of ``files_per`` documents."""
    group: list = []
    index = 0
    for document in documents:
        group.append(document)
        if len(group) == files_per:
            yield index, group
            group, index = [], index + 1
    if group:
        yield index, group


def _process_groups(files, finished, tokenizer, settings, output_dir, processes, progress) -> Iterator[Summary]:
    """Encode and write every unfinished group, in-process or in worker processes (data/workers.py)."""
    started = time.monotonic()
    tokens_so_far = 0

    def show_progress(documents: int, tokens: int) -> None:
        nonlocal tokens_so_far
        tokens_so_far += tokens
        progress.update(documents)
        rate = tokens_so_far / max(time.monotonic() - started, 1e-9)
        progress.set_postfix(tokens=tokens_so_far, tok_per_s=f"{rate:,.0f}", refresh=False)

    pending_groups = _skip_finished(_groups(iter_documents(files), settings.files_per), finished)
    if processes == 1:
        for item in pending_groups:
            if isinstance(item, Summary):
                show_progress(item.documents_read, 0)
                yield item
            else:
                index, documents = item
                yield _encode_and_write_group(index, documents, tokenizer, settings, output_dir, show_progress)
        return
    for part in _process_groups_in_workers(pending_groups, tokenizer, settings, output_dir, processes):
        show_progress(part.documents_read, part.tokens_written)
        yield part


def _skip_finished(groups: Iterator[tuple], finished: dict) -> Iterator:
    """Pass unfinished groups through; replace finished ones by a Summary of what they hold."""
    for index, documents in groups:
        if index in finished:
            kept = Summary(documents_read=len(documents), documents_in_kept_files=len(documents))
            kept.output_files.append(finished[index])
            yield kept
        else:
            yield index, documents


def _encode_and_write_group(index, documents, tokenizer, settings, output_dir, on_progress=None) -> Summary:
    """Tokenize one group, build its examples and write them as one tfrecords file.

    ``on_progress(documents, tokens)`` (in-process mode) is called after every batch so the
    progress bar moves within large groups.
    """
    summary = Summary()
    examples: list = []
    chunk_stream: list = []
    for start in range(0, len(documents), ENCODE_BATCH_DOCUMENTS):
        batch = documents[start:start + ENCODE_BATCH_DOCUMENTS]
        part = _encode_batch(batch, tokenizer, settings, examples if settings.mode == "documents" else chunk_stream)
        if on_progress is not None:
            on_progress(part.documents_read, part.tokens_written)
        summary.add(part)
    if settings.mode == "chunks":
        window = settings.n_ctx + 1
        usable = len(chunk_stream) // window * window
        examples = [chunk_stream[offset:offset + window] for offset in range(0, usable, window)]
        summary.chunk_tail_tokens_dropped = len(chunk_stream) - usable
        summary.tokens_written = usable
    summary.examples_written = len(examples)
    if examples:
        summary.output_files.append(_write_examples(examples, output_dir, settings.name, index))
        summary.files_written = 1
    return summary


def _encode_batch(documents: list, tokenizer: LoadedTokenizer, settings: EncodingSettings, sink: list) -> Summary:
    """Tokenize decodable documents; append kept ones (separator included) to ``sink``.

    In documents mode ``sink`` collects one list per document; in chunks mode it is one flat
    token stream.
    """
    summary = Summary(documents_read=len(documents))
    texts = []
    for document in documents:
        if document.decodable:
            texts.append(document.text)
        else:
            summary.undecodable += 1
            summary.undecodable_sources.append(document.source)
    for ids in tokenizer.encode_batch(texts) if texts else []:
        if not ids or len(ids) < settings.minimum_size:
            summary.discarded_short += 1
            continue
        tokens = ids + list(settings.separator)
        summary.documents_written += 1
        summary.tokens_written += len(tokens)
        if settings.mode == "documents":
            sink.append(tokens)
        else:
            sink.extend(tokens)
    return summary


def _write_examples(examples: list, output_dir: str, name: str, index: int) -> str:
    """Write ``examples`` to a temporary file, then rename it to its final, counted name. A failed write (a
    full disk) is an OSError naming output_dir; the temporary file is removed by the caller."""
    from console.tensorflow_import import import_tensorflow
    tf = import_tensorflow()  # here, so the CLI's argument errors stay instant; without Keras

    temporary = _temporary_path(output_dir, name, index)
    try:
        with tf.io.TFRecordWriter(temporary) as writer:
            for tokens in examples:
                feature = tf.train.Feature(int64_list=tf.train.Int64List(value=tokens))
                example = tf.train.Example(features=tf.train.Features(feature={"text": feature}))
                writer.write(example.SerializeToString())
    except tf.errors.OpError as exc:  # TF's own file errors, as the OSError main() reports for every failed write
        number = {tf.errors.ResourceExhaustedError: errno.ENOSPC,  # a full disk
                  tf.errors.PermissionDeniedError: errno.EACCES}.get(type(exc), errno.EIO)
        raise OSError(number, exc.message.rsplit("; ", 1)[-1], output_dir) from None
    final = os.path.join(output_dir, output_file_name(name, index, len(examples)))
    os.replace(temporary, final)
    return final


# ----------------------------------------------------------------------------- worker processes

_worker_state: dict = {}


def _initialise_worker(tokenizer_path: str, pretrained: bool, settings: EncodingSettings, output_dir: str) -> None:
    _worker_state.update(tokenizer=load_tokenizer(tokenizer_path, pretrained), settings=settings, output_dir=output_dir)


def _work_on_group(item: tuple) -> Summary:
    index, documents = item
    state = _worker_state
    return _encode_and_write_group(index, documents, state["tokenizer"], state["settings"], state["output_dir"])


def _process_groups_in_workers(pending_groups, tokenizer, settings, output_dir, processes) -> Iterator[Summary]:
    """Encode groups in worker processes, one group per worker at a time (memory: `processes` groups).

    Results come back in group order, so the summary and any error are deterministic.
    """
    # The workers write with TensorFlow (_write_examples): imported here, once, every forked worker has it loaded.
    # Imported in each worker instead it cost each ~6 CPU s (python -c "import tensorflow", 2-core AVX-512 EPYC):
    # a 2-process run of 400 small documents took 10.6 CPU s, one process 6.7.
    from console.tensorflow_import import import_tensorflow
    import_tensorflow()
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the workers inherit it: processes already use the cores
    try:
        with Workers(processes, _initialise_worker, (tokenizer.path, tokenizer.pretrained, settings, output_dir),
                     _work_on_group) as workers:
            yield from workers.imap(pending_groups, passthrough=lambda item: isinstance(item, Summary))
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)  # later in-process encoding may use the Rust threads again


def _nothing_written_message(summary: Summary, settings: EncodingSettings, input_dir: str) -> str:
    if summary.documents_read == 0:
        return f"no documents found in {input_dir}"
    if summary.undecodable == summary.documents_read:
        return f"all {summary.documents_read} documents in {input_dir} are undecodable (not UTF-8 text), e.g. {summary.undecodable_sources[0]}"
    if settings.mode == "chunks" and summary.documents_written:
        return (
            f"no complete window: every group of --files_per {settings.files_per} documents had fewer than "
            f"n_ctx+1 = {settings.n_ctx + 1} tokens; lower --n_ctx or raise --files_per"
        )
    return (
        f"all {summary.documents_read - summary.undecodable} decodable documents in {input_dir} are shorter than "
        f"--minimum_size {settings.minimum_size} tokens ({summary.undecodable} undecodable); lower --minimum_size"
    )


# ----------------------------------------------------------------------------- dataset config

def write_dataset_config(
    dataset_id: str,
    output_dir: str,
    name: str,
    tokenizer: LoadedTokenizer,
    split: str = "train",
    config_dir: str = DEFAULT_DATASET_CONFIG_DIR,
    note_missing_split: bool = True,
) -> str:
    """Write or update ``config_dir/{dataset_id}.json`` so a model config can name this dataset.

    ``split`` says whether these files are the training data (``path``) or the evaluation
    data (``eval_path``). Only that key is set; the other keeps its previous value, or is
    ``null`` until its split is written (a null ``eval_path`` means: no evaluation data; a
    null ``path``: nothing to train on yet). The file holds only the keys that
    ``config.load_dataset_config`` accepts. Relative paths are written relative to the
    folder that holds ``configs/``, which is what the loader resolves them against. Refuses
    to mix splits encoded with different tokenizers, and train and eval globs that match the
    same files. Returns the config's path.
    """
    if split not in ("train", "eval"):
        raise DataError(f"split must be train or eval, got {split!r}")
    _check_dataset_id(dataset_id)
    config_path = os.path.join(config_dir, f"{dataset_id}.json")
    base = _config_base(config_dir)
    files_glob = _portable_path(os.path.join(output_dir, f"{name}_*.tfrecords"), base)
    if tokenizer.pretrained and not os.path.isdir(tokenizer.path):  # a hub name ("gpt2")
        tokenizer_path = tokenizer.path
    else:  # a file, or a model folder: the loader resolves both like the data paths
        tokenizer_path = _portable_path(tokenizer.path, base)
    config = {
        "n_vocab": tokenizer.vocab_size,
        "path": None,
        "eval_path": None,
        "tokenizer_is_pretrained": tokenizer.pretrained,
        "tokenizer_path": tokenizer_path,
        "eos_id": tokenizer.eos_id,
        "padding_id": tokenizer.padding_id,
        # What encoded the files: a model config that records another tokenizer refuses this dataset.
        "tokenizer_id": {**tokenizer.tokenizer_id.to_json(), "from": tokenizer_path},
    }
    if os.path.exists(config_path):
        previous = _read_previous_config(config_path)
        same_tokenizer = all(previous.get(key) == config[key] for key in ("n_vocab", "tokenizer_path", "tokenizer_is_pretrained"))
        recorded = previous.get("tokenizer_id")
        if isinstance(recorded, dict) and recorded.get("sha256") != config["tokenizer_id"]["sha256"]:
            same_tokenizer = False  # the same path, but another tokenizer there now (a file retrained in place)
        if not same_tokenizer:
            raise DataError(f"{config_path} was written for tokenizer {previous.get('tokenizer_path')!r}; delete it or pass another --write_dataset_config id")
        config["path"], config["eval_path"] = previous.get("path"), previous.get("eval_path")
        for echo in previous.get("_placeholders", []):  # written by an earlier version: a key echoing the other split
            if echo in ("path", "eval_path"):
                config[echo] = None
    key, other = ("path", "eval_path") if split == "train" else ("eval_path", "path")
    config[key] = files_glob
    if config[other]:
        _check_splits_do_not_overlap(config, base, config_path)
    else:
        config[other] = None
    if not config[other] and note_missing_split:
        consequence = "training evaluates nothing and --eval has no data" if other == "eval_path" else "there is nothing to train on"
        print(f"note: {config_path}: {other} is null until the {'eval' if split == 'train' else 'train'} split is written "
              f"(--split {'eval' if split == 'train' else 'train'}); until then {consequence}", file=sys.stderr)
    os.makedirs(config_dir, exist_ok=True)
    write_json_atomically(config_path, config)
    return config_path


def _check_dataset_id(dataset_id: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", dataset_id or ""):
        raise DataError(f"dataset config id must be a plain name (letters, digits, _ . -), got {dataset_id!r}")


def _read_previous_config(config_path: str) -> dict:
    try:
        with open(config_path, encoding="utf-8") as handle:
            previous = json.load(handle)
    except json.JSONDecodeError as exc:
        raise DataError(f"{config_path} is not valid JSON ({exc.msg} at line {exc.lineno}); fix or delete it") from exc
    if not isinstance(previous, dict):
        raise DataError(f"{config_path} must hold a JSON object; fix or delete it")
    return previous


def _config_base(config_dir: str) -> str:
    """The folder relative paths in a dataset config are resolved against: the one holding ``configs/``."""
    return os.path.dirname(os.path.dirname(os.path.abspath(config_dir)))


def _resolve(path: str, base: str) -> str:
    return path if os.path.isabs(path) or "://" in path else os.path.join(base, path)


def _check_splits_do_not_overlap(config: dict, base: str, config_path: str) -> None:
    """Train and eval globs must not share files (e.g. ``x_*`` also matches ``x_eval_*`` in one folder)."""
    train = set(globlib.glob(_resolve(config["path"], base)))
    shared = sorted(train.intersection(globlib.glob(_resolve(config["eval_path"], base))))
    if shared:
        raise DataError(
            f"{config_path}: path {config['path']!r} and eval_path {config['eval_path']!r} both match {len(shared)} files "
            f"(e.g. {shared[0]}): keep each split in its own --output_dir (move those files there and rerun)"
        )


def dataset_config_path(path: str, config_dir: str) -> str:
    """`path` as a dataset config in config_dir stores it: relative to the folder holding configs/ when inside it
    (the loader resolves it there), else absolute."""
    return _portable_path(path, _config_base(config_dir))


def _portable_path(path: str, base: str = REPO_ROOT) -> str:
    """Paths under ``base`` are stored relative to it (see ``_config_base``), others absolute."""
    absolute = os.path.abspath(path)
    if absolute == base or absolute.startswith(base.rstrip(os.sep) + os.sep):
        return os.path.relpath(absolute, base)
    return absolute


# ----------------------------------------------------------------------------- command line

def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = ArgumentParser(prog="python data/create_tfrecords.py", description="Tokenize .txt files or lm_dataformat archives into tfrecords.")
    parser.add_argument("--mode", choices=MODES, default="documents", help="documents: one example per document (documents_* sampling); chunks: fixed n_ctx+1 windows (chunks sampling)")
    parser.add_argument("--input_dir", required=True, help="folder of .txt files (one document each) and/or lm_dataformat archives, or one archive")
    parser.add_argument("--glob", default=None, help="files to read inside --input_dir, e.g. '*.py' or '**/*.jsonl.zst'; files lm_dataformat does not know are read as plain text (default: .txt and lm_dataformat archives, recursively)")
    parser.add_argument("--name", required=True, help="output files are {name}_{i}_{N}.tfrecords, N = examples in the file")
    parser.add_argument("--output_dir", required=True, help="where to write the tfrecords")
    parser.add_argument("--use_gpt2_tokenizer", action="store_true", help="use the pretrained GPT-2 tokenizer (separator defaults to its eos, 50256)")
    parser.add_argument("--gpt2_tokenizer_path", default="gpt2", help="local folder holding the GPT-2 tokenizer files (vocab.json + merges.txt or tokenizer.json)")
    parser.add_argument("--encoder_path", default=None, help="tokenizer json (e.g. from data/train_tokenizer.py) when not using GPT-2")
    parser.add_argument("--tokenizer_from", metavar="DIR", default=None, help="encode with the tokenizer of this model folder (a released GPT-Neo's or HF's: tokenizer.json, or vocab.json and merges.txt), as a model imported from it reads")
    parser.add_argument("--separator", default=None, help="JSON list of token ids appended to every document (default: [eos_id] of the tokenizer)")
    parser.add_argument("--minimum_size", type=int, default=100, help="documents with fewer tokens are discarded; choose stitch so that stitch * minimum_size >= n_ctx")
    parser.add_argument("--files_per", type=int, default=100000, help="input documents per output file")
    parser.add_argument("--processes", type=int, default=1, help="worker processes (each encodes whole files)")
    parser.add_argument("--n_ctx", type=int, default=2048, help="chunks mode: windows hold n_ctx + 1 tokens")
    parser.add_argument("--write_dataset_config", metavar="ID", default=None, help="also write configs/dataset_configs/ID.json describing the output")
    parser.add_argument("--split", choices=("train", "eval"), default="train", help="with --write_dataset_config: these files are the config's path (train) or eval_path (eval)")
    parser.add_argument("--dataset_config_dir", metavar="DIR", default=DEFAULT_DATASET_CONFIG_DIR, help="with --write_dataset_config: the folder to write ID.json into (default: configs/dataset_configs of this repository)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def parse_separator(text: Optional[str]) -> Optional[list]:
    """The --separator JSON list, or None for the tokenizer's default."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"--separator must be a JSON list of token ids such as [0], got {text!r}") from exc
    if not isinstance(value, list) or not value:
        raise DataError(f"--separator must be a non-empty JSON list of token ids such as [0], got {text!r}")
    return value


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that the run stops the way Ctrl-C stops it."""


def _raise_terminated(signum, frame):
    raise _Terminated()


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()  # only there can signals be handled
    previous_sigterm = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    try:
        if args.tokenizer_from is not None:
            if args.encoder_path or args.use_gpt2_tokenizer:
                raise DataError("--tokenizer_from names the tokenizer already: drop --encoder_path / --use_gpt2_tokenizer")
            if not os.path.isdir(args.tokenizer_from):
                raise DataError(f"--tokenizer_from {args.tokenizer_from} is not a folder: pass the folder of a released "
                                f"model (or of tools.hf to_hf's export), which holds its tokenizer files")
            args.use_gpt2_tokenizer, args.gpt2_tokenizer_path = True, args.tokenizer_from
        if args.write_dataset_config is not None:
            _check_dataset_id(args.write_dataset_config)  # before the work, not after it
        summary = create_tfrecords(
            input_dir=args.input_dir, output_dir=args.output_dir, name=args.name, mode=args.mode,
            encoder_path=args.encoder_path, use_gpt2_tokenizer=args.use_gpt2_tokenizer,
            gpt2_tokenizer_path=args.gpt2_tokenizer_path, separator=parse_separator(args.separator),
            minimum_size=args.minimum_size, files_per=args.files_per, processes=args.processes,
            n_ctx=args.n_ctx, glob=args.glob, show_progress=not args.quiet,
        )
        print(summary.line())
        if args.write_dataset_config is not None:
            tokenizer = _load_chosen_tokenizer(args.encoder_path, args.use_gpt2_tokenizer, args.gpt2_tokenizer_path)
            path = write_dataset_config(args.write_dataset_config, args.output_dir, args.name, tokenizer, args.split, args.dataset_config_dir)
            print(f"wrote {path}")
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a failed write: disk full, read-only folder
        print(f"error: {exc.filename or args.output_dir}: {exc.strerror or exc}; finished files are kept: free "
              f"the space or fix the folder, then rerun the same command to resume", file=sys.stderr)
        return 1
    except WorkerLost as exc:
        print(f"error: {exc}; finished files are kept in {args.output_dir}: rerun the same command to resume "
              f"(with fewer --processes or a smaller --files_per if memory ran out)", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, _Terminated) as exc:
        print(f"interrupted: {_finished_count(args.output_dir, args.name)} finished files kept in {args.output_dir}; "
              f"rerun the same command to resume", file=sys.stderr)
        return 143 if isinstance(exc, _Terminated) else 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous_sigterm)
    return 0


def _finished_count(output_dir: str, name: str) -> int:
    try:
        return len(_finished_files(output_dir, name))
    except (OSError, DataError):
        return 0


if __name__ == "__main__":
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()  # TF's C++ start-up chatter would bury the progress bar; errors still show
    sys.exit(main())
