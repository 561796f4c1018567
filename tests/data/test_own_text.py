"""data/own_text.py: your own text for an imported model, split into a training and a held-out part (every tenth
file, or a folder of its own), encoded with the model's tokenizer in the shape its dataset entry reads (documents
that fill a window when stitched, or windows of n_ctx + 1), and registered as one dataset. (from_hf --text_dir end
to end: tests/scenarios/test_finetune.py.)"""
import glob

import pytest

from config import load_dataset_config
from data.errors import DataError
from data.own_text import HELD_OUT_EVERY, encode_own_text, held_out_split
from data.tokenizer import load_tokenizer
from workspace import TOKENIZER

N_CTX = 16
# Token counts of the ten files doc_00 ... doc_09 (" value" is one token of the committed tokenizer: checked below).
LENGTHS = [4, 8, 9, 12, 20, 8, 9, 30, 5, 3]


def write_text(folder, lengths, tokenizer):
    folder.mkdir()
    for index, length in enumerate(lengths):
        text = " ".join(["value"] * length)
        assert len(tokenizer.encode(text)) == length
        (folder / f"doc_{index:02d}.txt").write_text(text)


def test_every_tenth_file_is_held_out_and_at_least_one():
    """Bugs caught: the first file of every ten held out (`i % HELD_OUT_EVERY == 0`), no file held out of fewer
    than ten (`or [files[-1]]` gone: nothing to evaluate on)."""
    files = [f"doc_{index:02d}.txt" for index in range(25)]
    train, held = held_out_split(files)
    assert held == [files[HELD_OUT_EVERY - 1], files[2 * HELD_OUT_EVERY - 1]] == ["doc_09.txt", "doc_19.txt"]
    assert train == [name for name in files if name not in held] and len(train) == 23
    assert held_out_split(files[:3]) == (files[:2], [files[2]])
    with pytest.raises(DataError, match="doc_00.txt is the only input file: .* pass --eval_text_dir"):
        held_out_split(files[:1])


def test_documents_too_short_to_fill_a_window_are_dropped_from_training_and_held_out_text_kept_whole(tmp_path):
    """Stitch 2 documents of at least ceil(17 / 2) = 9 tokens fill a window of n_ctx + 1 = 17; the held-out file
    (the tenth) keeps even its 3 tokens; the dataset config, written relative to the folder holding configs/,
    loads with both splits and the tokenizer's record.
    Bug caught: the minimum rounded down (`(n_ctx + 1) // stitch`: 8-token documents trained, whose stitched pair
    falls short of a window)."""
    tokenizer = load_tokenizer(TOKENIZER)
    write_text(tmp_path / "text", LENGTHS, tokenizer)
    registry = tmp_path / "configs" / "dataset_configs"
    encoded = encode_own_text(str(tmp_path / "text"), None, "mine", tokenizer, N_CTX, 2, "documents_random",
                              str(tmp_path / "data" / "mine"), str(registry), show_progress=False)
    trained = LENGTHS[:9]
    minimum = -(-(N_CTX + 1) // 2)
    assert minimum == 9 and encoded.held_out_files == 1
    assert encoded.train.documents_written == sum(length >= minimum for length in trained) == 5
    assert encoded.train.discarded_short == sum(length < minimum for length in trained) == 4
    assert encoded.held_out.documents_written == 1 and encoded.held_out.tokens_written == LENGTHS[9] + 1  # + eos
    dataset = load_dataset_config("mine", str(registry))
    assert dataset.tokenizer_id == tokenizer.tokenizer_id and encoded.config_path == str(registry / "mine.json")
    for path, split in ((dataset.path, "train"), (dataset.eval_path, "eval")):
        written = glob.glob(str(tmp_path / "data" / "mine" / split / "*.tfrecords"))
        assert len(written) == 1 and glob.glob(path) == written


def test_chunks_are_windows_of_every_file_when_the_held_out_text_has_its_own_folder(tmp_path):
    """A prechunked mode (`sequential`) cuts the training text into windows of n_ctx + 1 tokens; with
    --eval_text_dir every file of the text folder trains (the tenth too) and the other folder is held out.
    Bugs caught: the folder split although the held-out text has its own (`held_out_split` always), the windows
    cut at create_tfrecords' default n_ctx (2048: no window at all)."""
    tokenizer = load_tokenizer(TOKENIZER)
    write_text(tmp_path / "text", LENGTHS, tokenizer)
    write_text(tmp_path / "held", [6, 7], tokenizer)
    encoded = encode_own_text(str(tmp_path / "text"), str(tmp_path / "held"), "mine", tokenizer, N_CTX, 1,
                              "sequential", str(tmp_path / "data"), str(tmp_path / "configs" / "dataset_configs"),
                              show_progress=False)
    assert encoded.train.documents_written == len(LENGTHS)
    stream = sum(length + 1 for length in LENGTHS)  # every document and its eos, one stream
    assert encoded.train.examples_written == stream // (N_CTX + 1) == 6
    assert encoded.train.tokens_written == 6 * (N_CTX + 1) and encoded.train.chunk_tail_tokens_dropped == stream % (N_CTX + 1)
    assert encoded.held_out_files == 2 and encoded.held_out.documents_written == 2
