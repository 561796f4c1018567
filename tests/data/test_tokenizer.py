"""Tokenizer loading, the committed stdlib tokenizer, and BPE training."""

import os

import lm_dataformat
import pytest

import corpus
from data.errors import DataError
from data.tokenizer import load_tokenizer
from data.train_tokenizer import DEFAULT_SPECIAL_TOKENS, main as train_main, train_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STDLIB_TOKENIZER = os.path.join(REPO, "data", "tokenizers", "stdlib-bpe-4096.json")
TRICKY_SOURCE = 'def f(x):\n\tif x:\r\n        return  "ü 漢字 \\n"  # tail   \n\n\n    \n'


def test_committed_stdlib_tokenizer_has_fixed_special_ids_and_round_trips():
    tokenizer = load_tokenizer(STDLIB_TOKENIZER)
    assert tokenizer.vocab_size == 4096
    ids = [tokenizer.backend.token_to_id(token) for token in DEFAULT_SPECIAL_TOKENS]
    assert ids == [0, 1, 2, 3]
    assert (tokenizer.eos_id, tokenizer.padding_id) == (0, 1)
    texts = corpus.documents("train") + [TRICKY_SOURCE, ""]
    for text, ids in zip(texts, tokenizer.encode_batch(texts)):
        assert ids == tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
        assert all(0 <= i < tokenizer.vocab_size for i in ids)


def test_missing_tokenizer_file_names_the_path(tmp_path):
    missing = str(tmp_path / "nope.json")
    with pytest.raises(DataError, match="nope.json"):
        load_tokenizer(missing)


def test_pretrained_hub_name_offline_asks_for_a_local_folder(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="local folder") as error:
        load_tokenizer("gpt2-no-such-cache-entry", pretrained=True)
    assert "\n" not in str(error.value)


def test_pretrained_gpt2_style_local_folder_loads(tmp_path, monkeypatch):
    """A folder with vocab.json + merges.txt (the GPT-2 file layout) loads via transformers."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    reference = load_tokenizer(STDLIB_TOKENIZER)
    reference.backend.model.save(str(tmp_path))  # writes vocab.json and merges.txt
    pretrained = load_tokenizer(str(tmp_path), pretrained=True)
    text = "import os\nprint(os.getcwd())\n"
    assert pretrained.encode(text) == reference.encode(text)
    assert pretrained.decode(pretrained.encode(text)) == text
    assert pretrained.eos_id == reference.eos_id


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
