"""data/train_tokenizer.py: byte-level BPE trained on a folder (with a glob) or an lm_dataformat archive, saved
as one tokenizers JSON with fixed special-token ids; a vocabulary too small for the bytes is refused."""

import os

import lm_dataformat
import pytest

from data.errors import DataError
from data.tokenizer import load_tokenizer
from data.train_tokenizer import DEFAULT_SPECIAL_TOKENS, main as train_main, train_tokenizer
from tests.data.test_tokenizer import TRICKY_SOURCE


def _write_sources(folder, count=12):
    folder.mkdir()
    for index in range(count):
        body = "".join(f"def function_{index}_{line}(value):\n    return value * {line} + {index}\n\n" for line in range(30))
        (folder / f"module_{index}.py").write_text(body, encoding="utf-8")
    (folder / "notes.md").write_text("not python", encoding="utf-8")


def test_train_tokenizer_on_a_folder_with_glob(tmp_path):
    sources = tmp_path / "src"
    _write_sources(sources)
    output = tmp_path / "tok.json"
    assert train_main(["--input_dir", str(sources), "--glob", "*.py", "--vocab_size", "400", "--output", str(output)]) == 0
    tokenizer = load_tokenizer(str(output))
    assert [tokenizer.backend.token_to_id(token) for token in DEFAULT_SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert 256 + len(DEFAULT_SPECIAL_TOKENS) < tokenizer.vocab_size <= 400
    text = (sources / "module_3.py").read_text(encoding="utf-8") + TRICKY_SOURCE
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert not os.path.exists(str(output) + ".tmp")


def test_train_tokenizer_on_an_lm_dataformat_archive(tmp_path):
    archive = lm_dataformat.Archive(str(tmp_path / "archive"))
    for index in range(20):
        archive.add_data(f"document {index}: " + "the quick brown fox jumps over the lazy dog. " * 5)
    archive.commit()
    output = tmp_path / "tok.json"
    tokenizer = train_tokenizer(str(tmp_path / "archive"), str(output), vocab_size=300, special_tokens=["<|endoftext|>", "<|padding|>"], show_progress=False)
    assert tokenizer.token_to_id("<|endoftext|>") == 0 and tokenizer.token_to_id("<|padding|>") == 1
    loaded = load_tokenizer(str(output))
    assert loaded.decode(loaded.encode("the lazy dog")) == "the lazy dog"


def test_train_tokenizer_rejects_a_tiny_vocabulary(tmp_path):
    sources = tmp_path / "src"
    _write_sources(sources, count=1)
    with pytest.raises(DataError, match="vocab_size"):
        train_tokenizer(str(sources), str(tmp_path / "t.json"), vocab_size=100, pattern="*.py", show_progress=False)


def test_a_truncated_archive_is_refused_in_one_line_and_no_tokenizer_is_written(tmp_path, capsys):
    """A .jsonl.zst cut where a zstd block ends would train on its first documents only, without a word.
    Bug caught: `check_whole(files)` dropped from `train_tokenizer` (exit 0, a tokenizer of part of the data)."""
    from tests.data.test_documents import zstd_blocks

    whole, block_ends = zstd_blocks([f"document {index}: " + "the quick brown fox. " * 20 for index in range(6)])
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "set.jsonl.zst").write_bytes(whole[:block_ends[2]])
    output = tmp_path / "tok.json"
    assert train_main(["--input_dir", str(tmp_path / "in"), "--vocab_size", "300", "--output", str(output)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "set.jsonl.zst is truncated" in lines[0], lines
    assert not os.path.exists(output) and not os.path.exists(str(output) + ".tmp")
