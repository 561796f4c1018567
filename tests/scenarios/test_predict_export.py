"""main.py --predict (batched prompts, text and jsonl, seeds) and --export (a SavedModel that a fresh process
loads with tf.saved_model.load and that samples exactly what --predict sampled). main() runs in this process;
the SavedModel is loaded in another, which has not built the model's graph."""
import json
import os

import numpy as np
import pytest

from data.tokenizer import load_tokenizer
from devices import precision
from devices.placement import Placement
from infer.export import export_saved_model
from config import load_config
from schema import ConfigError
from tiny import compute_logits, devices_for
from workspace import TOKENIZER, copy_workspace, run_main_in_process as run_main, run_python


@pytest.fixture(scope="module")
def trained(trained_workspace, tmp_path_factory):
    """This module's copy of the session's trained workspace (a step-2 checkpoint), with sampling settings."""
    root = tmp_path_factory.mktemp("predict")
    config, _ = copy_workspace(trained_workspace, root, sampling_seed=5, top_k=10, temperature=0.9)
    (root / "lines.txt").write_text("import json\n\nimport os\n")
    (root / "class.txt").write_text("class Foo")
    return root, config, load_config(config)


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def predicted(trained):
    root, config, _ = trained
    result = run_main("--model", config, "--predict", "--prompt", str(root / "lines.txt"), str(root / "class.txt"),
                      "--prompt_per_line", "--num_samples", "2", "--predict_output", str(root / "out" / "first"))
    assert result.returncode == 0, result.stderr
    return result, read_jsonl(root / "out" / "first.jsonl")


def test_predict_samples_every_prompt_in_batches_as_text_and_jsonl(trained, predicted):
    root, config, cfg = trained
    result, records = predicted
    tokenizer = load_tokenizer(TOKENIZER)
    # 3 prompts (two lines of one file, one file) x 2 samples = 6 rows: a full batch of 4 and a padded one.
    assert [r["prompt_index"] for r in records] == [0, 0, 1, 1, 2, 2]
    assert [r["prompt"] for r in records[::2]] == ["import json", "import os", "class Foo"]
    assert all(r["step"] == 2 for r in records)
    assert len({r["seed"] for r in records}) == 6
    for r in records:
        assert r["prompt_ids"] == tokenizer.encode(r["prompt"])
        assert 1 <= len(r["tokens"]) + r["stopped"] <= cfg.max_new_tokens
        assert r["completion"] == tokenizer.decode(r["tokens"])
        assert r["text"] == r["prompt"] + r["completion"]
    text = (root / "out" / "first.txt").read_text()
    assert text.count("======== sample") == 6 and all(r["text"] in text for r in records)
    assert result.stdout.count("======== sample") == 6 and "kv cache" in result.stdout
    assert records[0]["tokens"] != records[1]["tokens"]  # two samples of one prompt differ

    # The same seed samples the same tokens; --remove_partial_sequences leaves the prompt out of the text.
    again = run_main("--model", config, "--predict", "--prompt", str(root / "lines.txt"), str(root / "class.txt"),
                     "--prompt_per_line", "--num_samples", "2", "--remove_partial_sequences",
                     "--predict_output", str(root / "out" / "again"))
    assert again.returncode == 0, again.stderr
    repeated = read_jsonl(root / "out" / "again.jsonl")
    assert [r["tokens"] for r in repeated] == [r["tokens"] for r in records]
    assert all(r["text"] == r["completion"] for r in repeated)
    assert "import json" not in (root / "out" / "again.txt").read_text()


LOAD_AND_RUN = """
import json, sys
import numpy as np
import tensorflow as tf
export_dir, rows_path, out_path = sys.argv[1:4]
rows = json.load(open(rows_path))
model = tf.saved_model.load(export_dir)
generate, logits = model.signatures["serving_default"], model.signatures["logits"]
tokens = tf.constant(np.array(rows["tokens"], np.int32))
out = generate(tokens=tokens, prompt_length=tf.constant(np.array(rows["prompt_length"], np.int32)),
               seed=tf.constant(np.array(rows["seed"], np.int32)))
np.savez(out_path, tokens=out["tokens"].numpy(), lengths=out["lengths"].numpy(),
         logits=logits(tokens=tokens)["logits"].numpy(), signatures=np.array(sorted(model.signatures.keys())))
"""


@pytest.mark.slow
def test_export_writes_a_saved_model_that_samples_what_predict_sampled(trained, predicted):
    root, config, cfg = trained
    _, records = predicted
    export_dir = root / "exported"
    result = run_main("--model", config, "--export", "--export_dir", str(export_dir))
    assert result.returncode == 0, result.stderr
    assert (export_dir / "saved_model.pb").exists()
    assert (export_dir / "assets.extra" / "gpt_config.json").exists()
    assert (export_dir / "assets.extra" / os.path.basename(TOKENIZER)).exists()

    batch = records[:cfg.predict_batch_size]  # the first batch --predict ran
    tokens = np.full([len(batch), cfg.n_ctx], cfg.padding_id, np.int32)
    for i, r in enumerate(batch):
        tokens[i, :len(r["prompt_ids"])] = r["prompt_ids"]
    rows = {"tokens": tokens.tolist(), "prompt_length": [len(r["prompt_ids"]) for r in batch],
            "seed": [r["seed"] for r in batch]}
    (root / "rows.json").write_text(json.dumps(rows))
    loaded = run_python(LOAD_AND_RUN, str(export_dir), str(root / "rows.json"), str(root / "served.npz"))
    assert loaded.returncode == 0, loaded.stderr
    served = np.load(root / "served.npz")
    assert set(served["signatures"]) == {"serving_default", "generate", "logits"}
    for i, r in enumerate(batch):
        start, end = rows["prompt_length"][i], int(served["lengths"][i])
        new = served["tokens"][i, start:end].tolist()
        assert new == r["tokens"] + ([cfg.eos_id] if r["stopped"] else []), i
        assert served["tokens"][i, :start].tolist() == r["prompt_ids"]
    # in the precision the export resolved on this CPU (precision auto: bf16 where it has bf16 units)
    resolved = precision.resolve_for_inference(cfg, Placement(devices=tuple(devices_for(cfg)))).cfg
    ours = compute_logits(resolved, tokens, devices_for(cfg), cfg.model_path)
    np.testing.assert_allclose(served["logits"], ours, atol=1e-4, rtol=0)
    assert np.abs(ours).max() > 0.1

    with pytest.raises(ConfigError, match="already exists"):  # never overwrites an export
        export_saved_model(cfg, cfg.model_path, str(export_dir))
