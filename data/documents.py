"""Find input files and stream their documents, for tokenizer training and tfrecord creation.

Plain text files hold one document each. Everything lm_dataformat can read (jsonl, jsonl.zst,
json.zst, zip, tar.gz, ...) is streamed with its ``Reader`` so the formats stay exactly those
of the reference tools. Files are always visited in sorted order, which makes the document
sequence, and hence everything derived from it, deterministic. ``check_whole`` refuses an archive
cut short (a download that stopped early), which the readers would otherwise take for a shorter one.
"""

from __future__ import annotations

import glob as globlib
import gzip
import lzma
import os
import tarfile
import zipfile
from dataclasses import dataclass
from typing import Iterator, Optional

import lm_dataformat
import zstandard

from data.errors import DataError

PLAIN_TEXT_SUFFIX = ".txt"
ZSTD_SUFFIXES = (".jsonl.zst", ".json.zst", ".dat.zst")
CHECK_READ_BYTES = 8192  # compressed bytes fed per call: zstd output is kept below ~256 MiB even for runs of one byte


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


def _is_archive(path: str) -> bool:
    """True for the files lm_dataformat streams; the rest (.txt, and what an explicit glob picked) are one document
    each."""
    return is_supported_file(path) and not path.endswith(PLAIN_TEXT_SUFFIX)


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
        if _is_archive(path):
            yield from _read_archive(path)
        else:
            yield _read_plain_text(path)


def check_whole(files: list[str]) -> None:
    """Raise DataError naming the first compressed input that ends before its compressed stream does.

    A .jsonl.zst cut at a block or frame boundary reads as a shorter, valid file (zstandard's stream reader, which
    lm_dataformat uses, returns what it has and stops), so the documents after the cut would go missing without a
    word; gzip and xz raise at a cut, but part-way through the run. Decompressing each archive once here, and
    discarding the output, costs a small fraction of tokenizing it and lets the tools refuse before writing.
    Damage that is not a cut (bad bytes) is left to ``iter_documents``, which counts the archive as undecodable.
    """
    for path in files:
        if not _is_archive(path):
            continue
        try:
            problem = _truncation(path)
        except (OSError, ValueError, EOFError, zstandard.ZstdError, tarfile.TarError, lzma.LZMAError):
            problem = None  # damaged rather than cut: the reader reports it
        if problem:
            raise DataError(f"{path} is truncated ({problem}), so the documents after the cut would be missing: "
                            f"re-download it or compress it again from the original, then rerun")


def _truncation(path: str) -> Optional[str]:
    """What shows ``path`` to be cut off, or None when its compressed streams end where they should."""
    if path.endswith(ZSTD_SUFFIXES):
        with open(path, "rb") as handle:
            return None if _zstd_frames_end(handle) else "its zstd stream ends inside a frame"
    if path.endswith(".jsonl.zst.tar"):
        size = os.path.getsize(path)
        with tarfile.open(path, "r:") as archive:
            for member in archive:
                if member.offset_data + -(-member.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE > size:  # data, padded
                    return f"its member {member.name} is cut off"
                if member.isfile() and not _zstd_frames_end(archive.extractfile(member)):
                    return f"its member {member.name} ends inside a zstd frame"
            end = archive.offset  # where the next header, or the end-of-archive zero block, starts
        with open(path, "rb") as handle:
            handle.seek(end)
            block = handle.read(tarfile.BLOCKSIZE)
        return None if block == bytes(tarfile.BLOCKSIZE) else "it ends without tar's end-of-archive block"
    if path.endswith(".zip"):
        try:
            zipfile.ZipFile(path).close()
        except zipfile.BadZipFile:  # its directory, at the very end, is missing
            return "no zip directory at its end"
        return None
    opener = gzip.open if path.endswith(".gz") else lzma.open if path.endswith(".xz") else None
    if opener is None:  # .jsonl: plain text, nothing marks its end
        return None
    try:
        with opener(path, "rb") as stream:
            while stream.read(1 << 20):
                pass
    except EOFError:
        return f"its {'gzip' if opener is gzip.open else 'xz'} stream ends before its end marker"
    return None


def _zstd_frames_end(handle) -> bool:
    """True when every zstd frame in ``handle`` is complete (frames may follow one another, as `cat` or pzstd
    make them); False when the data stops inside one."""
    decompressor = zstandard.ZstdDecompressor()
    frame = None  # the decompressor of the frame being read; None between frames
    while chunk := handle.read(CHECK_READ_BYTES):
        while chunk:
            if frame is None:
                frame = decompressor.decompressobj()
            frame.decompress(chunk)
            if not frame.eof:
                break
            chunk, frame = frame.unused_data, None
    return frame is None


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
