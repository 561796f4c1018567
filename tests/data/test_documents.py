"""data/documents.py: the input files found (sorted; .txt and lm_dataformat archives, or what a glob names) and
their documents streamed, every archive type lm_dataformat reads; a document that is not text is yielded as
undecodable, for the tools to count, never raised; an archive cut short is refused by `check_whole`."""
import json
import os

import pytest

from data.documents import iter_documents, list_input_files
from data.errors import DataError
from tests.data.test_create_tfrecords import make_text, run


def test_every_archive_type_lm_dataformat_reads(tmp_path):
    """jsonl, jsonl.zst, jsonl.zst.tar, json.zst, json.gz, gz, zip and tar.gz, each holding the same two documents
    (a .gz holds lines, so one document per line)."""
    import gzip
    import io
    import tarfile
    import zipfile

    import zstandard

    from data.documents import iter_documents, list_input_files

    documents = [make_text(1, 2), "second document, not ASCII: é 漢字"]
    folder = tmp_path / "in"
    folder.mkdir()
    jsonl = "".join(json.dumps({"text": text}) + "\n" for text in documents).encode("utf-8")
    (folder / "a.jsonl").write_bytes(jsonl)
    (folder / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl))
    (folder / "c.json.zst").write_bytes(zstandard.ZstdCompressor().compress(json.dumps(documents).encode("utf-8")))
    with gzip.open(folder / "d.json.gz", "wb") as handle:
        handle.write(jsonl)
    with gzip.open(folder / "e.gz", "wt", encoding="utf-8") as handle:
        handle.write("".join(text.replace("\n", " ") + "\n" for text in documents))
    with zipfile.ZipFile(folder / "f.zip", "w") as archive:
        for index, text in enumerate(documents):
            archive.writestr(f"{index}.txt", text)

    def add(archive, name, data):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))

    with tarfile.open(folder / "g.tar.gz", "w:gz") as archive:
        for index, text in enumerate(documents):
            add(archive, f"{index}.txt", text.encode("utf-8"))
    with tarfile.open(folder / "h.jsonl.zst.tar", "w") as archive:
        add(archive, "part.jsonl.zst", zstandard.ZstdCompressor().compress(jsonl))

    files = list_input_files(str(folder))
    assert [os.path.basename(path) for path in files] == sorted(os.listdir(folder))
    by_file = {}
    for document in iter_documents(files):
        by_file.setdefault(os.path.basename(document.source), []).append(document.text)
    for name, texts in by_file.items():
        expected = [text.replace("\n", " ") + "\n" for text in documents] if name == "e.gz" else documents
        assert texts == expected, name
    assert len(by_file) == 8
    summary = run(folder, tmp_path / "out", files_per=100)
    assert summary.documents_read == summary.documents_written == 16 and summary.undecodable == 0


def test_documents_that_are_not_text_are_undecodable_and_a_broken_archive_ends_with_one(tmp_path):
    """Bytes that are not UTF-8, a JSON string holding a lone surrogate (no tokenizer can encode it) and a "text"
    that is not a string are each one undecodable document beside the good ones; an archive that breaks part-way
    (a line that is not JSON) gives its documents up to there, then one undecodable document, and the files after
    it are read.
    Bugs caught: `_is_encodable_text` taking any str (the surrogate reaches the tokenizer), the archive's
    `except` gone (a traceback from the broken archive)."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"\xff\xfe not utf-8")
    (folder / "b.jsonl").write_text('{"text": "first"}\n{"text": "\\ud800 lone"}\n{"text": 5}\n{"text": "last"}\n')
    texts = [make_text(index, 2) for index in range(3)]
    lines = [json.dumps({"text": text}) for text in texts]
    (folder / "c.jsonl").write_text("\n".join(lines[:2] + ['{"text": "cut sh'] + lines[2:]) + "\n")
    (folder / "d.txt").write_text("after the break")

    read = {}
    for document in iter_documents(list_input_files(str(folder))):
        assert document.decodable == (document.text is not None)
        read.setdefault(os.path.basename(document.source), []).append(document.text)
    assert read == {"a.txt": [None], "b.jsonl": ["first", None, None, "last"], "c.jsonl": texts[:2] + [None],
                    "d.txt": ["after the break"]}


def test_a_folder_of_other_files_names_glob_and_a_glob_recurses(tmp_path):
    """Without --glob only .txt and lm_dataformat archives are read: a folder of other files is one error naming
    --glob (not "empty"); a glob's `**` reaches every depth, the top one included, and its files are plain text.
    Bug caught: the glob matched without `recursive=True` (`**` one folder deep: nothing here)."""
    (tmp_path / "notes.md").write_text("# notes")
    (tmp_path / "top.py").write_text("x = 1\n")
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "sub" / "deeper" / "low.py").write_text("y = 2\n")
    with pytest.raises(DataError, match=r"^no supported files in .*use --glob to read other files"):
        list_input_files(str(tmp_path))
    files = list_input_files(str(tmp_path), "**/*.py")
    assert files == [str(tmp_path / "sub" / "deeper" / "low.py"), str(tmp_path / "top.py")]
    assert [document.text for document in iter_documents(files)] == ["y = 2\n", "x = 1\n"]


def test_a_corrupt_zstd_archive_is_one_undecodable_document_and_the_next_file_is_read(tmp_path):
    """A .jsonl.zst whose second zstd frame is damaged (a disk error, a bad copy): the first frame's documents,
    then one undecodable document, and the file after it is read; no traceback.
    Bug caught: `zstandard.ZstdError` left out of `_read_archive`'s except (it derives from Exception alone:
    create_tfrecords printed a traceback)."""
    import zstandard

    folder = tmp_path / "in"
    folder.mkdir()
    texts = [make_text(index, 2) for index in range(20)]
    frame = zstandard.ZstdCompressor(level=1).compress("".join(json.dumps({"text": t}) + "\n" for t in texts).encode())
    (folder / "a.jsonl.zst").write_bytes(frame + b"\x28\xb5\x2f\xfd" + bytes(range(200)))  # magic, then junk
    (folder / "b.txt").write_text("after the damage")

    read = {}
    for document in iter_documents(list_input_files(str(folder))):
        read.setdefault(os.path.basename(document.source), []).append(document.text)
    assert read == {"a.jsonl.zst": texts + [None], "b.txt": ["after the damage"]}


def zstd_blocks(texts) -> tuple:
    """A .jsonl.zst of `texts`, one zstd block per document, and the byte offset where each block ends."""
    import io

    import zstandard

    buffer = io.BytesIO()
    writer = zstandard.ZstdCompressor().stream_writer(buffer, closefd=False)
    block_ends = []
    for text in texts:
        writer.write((json.dumps({"text": text}) + "\n").encode("utf-8"))
        writer.flush(zstandard.FLUSH_BLOCK)
        block_ends.append(buffer.tell())
    writer.flush(zstandard.FLUSH_FRAME)
    return buffer.getvalue(), block_ends


def test_a_zstd_archive_cut_at_a_block_boundary_reads_as_shorter_and_is_refused_as_truncated(tmp_path):
    """A .jsonl.zst cut where a zstd block ends, or inside one, reads as a valid, shorter file (lm_dataformat yields
    the documents of the whole blocks, no error, nothing undecodable), so `check_whole` must refuse it, naming it; the whole file, and
    one of two frames one after the other (as `cat` or pzstd write them), pass, and all their documents are read.
    Bug caught: `_zstd_frames_end` returning True at the end of the data whatever the frame's state (`frame is
    None` check gone): the cut file passed and its last four documents were silently missing."""
    from data.documents import check_whole

    texts = [make_text(index, 2) for index in range(6)]
    whole, block_ends = zstd_blocks(texts)
    cut = tmp_path / "cut.jsonl.zst"
    cut.write_bytes(whole[:block_ends[1]])
    assert [document.text for document in iter_documents([str(cut)])] == texts[:2]  # what the reader alone does
    with pytest.raises(DataError, match=r"cut\.jsonl\.zst is truncated \(its zstd stream ends inside a frame\)") as error:
        check_whole([str(cut)])
    assert "re-download it" in str(error.value) and "\n" not in str(error.value)
    cut.write_bytes(whole[:block_ends[1] + 5])  # inside the third block: no error from the reader either
    assert [document.text for document in iter_documents([str(cut)])] == texts[:2]
    with pytest.raises(DataError, match="truncated"):
        check_whole([str(cut)])

    frames = tmp_path / "frames.jsonl.zst"
    frames.write_bytes(whole + zstd_blocks(texts[:1])[0])
    check_whole([str(frames)])
    assert [document.text for document in iter_documents([str(frames)])] == texts + texts[:1]
    frames.write_bytes(whole + zstd_blocks(texts[:1])[0][:-3])  # the second frame cut
    with pytest.raises(DataError, match="truncated"):
        check_whole([str(frames)])


def whole_archive(kind: str, texts) -> bytes:
    """`texts` in an archive of `kind` (a file suffix), as the tools would read it."""
    import gzip
    import io
    import lzma
    import tarfile
    import zipfile

    jsonl = "".join(json.dumps({"text": text}) + "\n" for text in texts).encode("utf-8")
    buffer = io.BytesIO()
    if kind in (".json.gz", ".gz"):
        return gzip.compress(jsonl)
    if kind == "_data.xz":
        return lzma.compress(jsonl)
    if kind == ".zip":
        with zipfile.ZipFile(buffer, "w") as archive:
            for index, text in enumerate(texts):
                archive.writestr(f"{index}.txt", text)
        return buffer.getvalue()
    with tarfile.open(fileobj=buffer, mode="w:gz" if kind == ".tar.gz" else "w") as archive:
        for index in range(2):
            data = zstd_blocks(texts)[0] if kind == ".jsonl.zst.tar" else texts[index].encode("utf-8")
            info = tarfile.TarInfo(f"{index}.jsonl.zst")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize("kind, cut_at, problem", [
    (".json.gz", -4, "its gzip stream ends before its end marker"),
    (".gz", -30, "its gzip stream ends before its end marker"),
    (".tar.gz", -4, "its gzip stream ends before its end marker"),
    ("_data.xz", -4, "its xz stream ends before its end marker"),
    (".zip", -4, "no zip directory at its end"),
    (".jsonl.zst.tar", 1000, "its member 0.jsonl.zst is cut off"),  # in the padding after its data
    (".jsonl.zst.tar", "second member's data", "its member 1.jsonl.zst is cut off"),
    (".jsonl.zst.tar", "first member's end", "it ends without tar's end-of-archive block"),
])
def test_every_compressed_archive_type_cut_short_is_refused_as_truncated_and_whole_passes(tmp_path, kind, cut_at, problem):
    """gzip and xz raise EOFError at a cut, but part-way through a run (where `_read_archive` made it one
    undecodable document and a warning); a cut zip lost its directory (a BadZipFile traceback); a .jsonl.zst.tar
    cut between members read as a shorter tar. `check_whole` refuses each before anything is read, and passes the
    whole archive. Bug caught: the tar's end-of-archive block left unchecked (`block == ...` always true): a tar cut
    where a member ends passed and its later members were missing."""
    from data.documents import check_whole

    texts = [make_text(index, 3) for index in range(4)]
    whole = whole_archive(kind, texts)
    path = tmp_path / f"set{kind}"
    path.write_bytes(whole)
    check_whole([str(path)])
    member_end = 512 + -(-len(zstd_blocks(texts)[0]) // 512) * 512  # a header, then the data padded to a block
    cut_at = {"first member's end": member_end, "second member's data": member_end + 512 + 20}.get(cut_at, cut_at)
    path.write_bytes(whole[:cut_at])
    with pytest.raises(DataError, match=rf"set{kind} is truncated \({problem}\)"):
        check_whole([str(path)])
