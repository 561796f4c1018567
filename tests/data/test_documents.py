"""data/documents.py: the input files found (sorted; .txt and lm_dataformat archives, or what a glob names) and
their documents streamed, every archive type lm_dataformat reads; a document that is not text is yielded as
undecodable, for the tools to count, never raised."""
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
