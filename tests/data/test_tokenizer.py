"""data/tokenizer.py: tokenizer loading and the committed stdlib tokenizer (BPE training:
tests/data/test_train_tokenizer.py)."""

import os

import pytest

import corpus
from data.errors import DataError
from data.tokenizer import load_tokenizer
from data.train_tokenizer import DEFAULT_SPECIAL_TOKENS

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
