"""Find input files and stream their documents, for tokenizer training and tfrecord creation.

Plain text files hold one document each. Everything lm_dataformat can read (jsonl, jsonl.zst,
json.zst, zip, tar.gz, ...) is streamed with its ``Reader`` so the formats stay exactly those
of the reference tools. Files are always visited in sorted order, which makes the document
sequence, and hence everything derived from it, deterministic.
"""

from __future__ import annotations

import glob as globlib
import os
from dataclasses import dataclass
from typing import Iterator, Optional

import lm_dataformat
import zstandard

from data.errors import DataError

PLAIN_TEXT_SUFFIX = ".txt"


@dataclass(frozen=True)
class Document:
    """One input document; ``text`` is None when its bytes are not valid UTF-8 text."""

    source: str
    text: Optional[str]

    @property
    def decodable(self) -> bool:
        return self.text is not None


def is_supported_file(path: str) -> bool:
    """True for files the default (no --glob) scan picks up: .txt and lm_dataformat archives."""
    return lm_dataformat.has_valid_extension(os.path.basename(path))


def list_input_files(input_path: str, pattern: Optional[str] = None) -> list[str]:
    """Sorted input files under ``input_path`` (a folder, or a single file).

    Without ``pattern`` every supported file is taken, recursively; with one, the glob is
    matched relative to the folder (``**`` recurses). Raises DataError when nothing is found,
    because an empty run would otherwise silently produce an empty dataset.
    """
    if not input_path:
        raise DataError("no input given: pass --input_dir, a folder of .txt files or lm_dataformat archives")
    if os.path.isfile(input_path):
        return [input_path]
    if not os.path.isdir(input_path):
        raise DataError(f"input folder not found: {input_path}")
    if pattern:
        matches = globlib.glob(os.path.join(input_path, pattern), recursive=True)
        files = sorted(path for path in matches if os.path.isfile(path))
        if not files:
            raise DataError(f"glob {pattern!r} matched no files in {input_path}")
        return files
    files = sorted(
        os.path.join(root, name)
        for root, _dirs, names in os.walk(input_path)
        for name in names
        if is_supported_file(name)
    )
    if not files:
        if not any(names for _root, _dirs, names in os.walk(input_path)):
            raise DataError(f"input folder is empty: {input_path}")
        raise DataError(
            f"no supported files in {input_path} (expected .txt or lm_dataformat archives such as .jsonl.zst; "
            "use --glob to read other files as plain text)"
        )
    return files


def iter_documents(files: list[str]) -> Iterator[Document]:
    """Every document of ``files`` in order; undecodable ones are yielded with ``text=None``.

    Plain text (and any file whose type lm_dataformat does not know, picked by an explicit
    glob) is one document per file. Archives are streamed by lm_dataformat; if an archive
    turns out to be undecodable part-way, one undecodable document is reported for it and
    the rest of that archive is skipped (its stream cannot be resumed past the bad bytes).
    """
    for path in files:
        if path.endswith(PLAIN_TEXT_SUFFIX) or not is_supported_file(path):
            yield _read_plain_text(path)
        else:
            yield from _read_archive(path)


def _read_plain_text(path: str) -> Document:
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        return Document(path, raw.decode("utf-8"))
    except UnicodeDecodeError:
        return Document(path, None)


def _read_archive(path: str) -> Iterator[Document]:
    reader = lm_dataformat.Reader(path)
    if path.endswith(".jsonl.zst.tar"):  # stream_data() raises NameError for these (lm_dataformat 0.0.20); its reader works
        stream = reader.read_jsonl_tar(path)
    else:
        stream = reader.stream_data()
    try:
        for item in stream:
            text = item.get("text") if isinstance(item, dict) else item  # .json.gz streams whole JSON objects
            yield Document(path, text if _is_encodable_text(text) else None)
    except (UnicodeDecodeError, ValueError, EOFError, OSError, zstandard.ZstdError) as exc:
        # json/gzip/zip errors derive from the first four, zstandard's from Exception alone; the archive cannot be
        # read further.
        del exc
        yield Document(path, None)


def _is_encodable_text(text: object) -> bool:
    """Reject non-strings and strings with lone surrogates (possible from JSON escapes)."""
    if not isinstance(text, str):
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
