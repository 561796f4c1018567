"""data/check.py, `--check_dataset`'s own work: each split of each dataset read through and described, every token
id beyond the model's or the dataset's vocabulary named in one error. (Through main.py: tests/scenarios/
test_commands.py, test_data_tools.py, and test_finetune.py for a tokenizer file that did not encode the data.)"""
import glob
import json

import pytest

from config import load_config
from data import check
from data.errors import DataError
from tests.data.test_create_tfrecords import read_records
from workspace import make_workspace


def test_every_split_past_its_vocabulary_is_named_in_one_error_and_a_good_dataset_passes(tmp_path, capsys):
    """Each split's line gives the files, documents, tokens and id range its records hold (read here on their
    own); a registry entry whose n_vocab is the largest id of one split and below the other's fails with both
    splits named, and nothing says it passed.
    Bugs caught: the check raising at the first split past its vocabulary (the second unnamed), an id equal to
    n_vocab let through (`top > ds.n_vocab`)."""
    config = make_workspace(tmp_path)
    assert check.run(load_config(config)) == 0
    out = capsys.readouterr().out
    tops = {}
    for split in ("train", "eval"):
        files = sorted(glob.glob(str(tmp_path / split / "*.tfrecords")))
        documents = [tokens for path in files for tokens in read_records(path)]
        ids = [token for tokens in documents for token in tokens]
        tops[split] = max(ids)
        assert (f"tiny ({split}) {tmp_path / split / split}_*.tfrecords: {len(files)} files, {len(documents)} "
                f"documents, {len(ids)} tokens, token ids {min(ids)}..{max(ids)}, document lengths "
                f"{min(map(len, documents))}..{max(map(len, documents))}\n") in out
    assert "tiny decoded sample: '" in out and out.endswith("dataset check passed\n")

    registry = tmp_path / "configs" / "dataset_configs"
    small = min(tops.values())  # each split holds an id of at least n_vocab: one past the vocabulary
    entry = json.loads((registry / "tiny.json").read_text())
    (registry / "small.json").write_text(json.dumps(dict(entry, n_vocab=small)))
    model = json.loads((tmp_path / "configs" / "tiny.json").read_text())
    (tmp_path / "configs" / "small.json").write_text(json.dumps(dict(model, datasets=[["small", 4, "documents_random",
                                                                                      1.0]])))
    cfg = load_config(str(tmp_path / "configs" / "small.json"))
    with pytest.raises(DataError) as error:
        check.run(cfg)
    message = str(error.value)
    for split in ("train", "eval"):
        assert f"small ({split}) has token id {tops[split]} >= its registered n_vocab {small}: fix n_vocab" in message
    assert "\n" not in message and "passed" not in capsys.readouterr().out
