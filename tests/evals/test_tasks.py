"""Eval tasks run on a checkpoint (evals/tasks.py): LAMBADA last-word accuracy and perplexity, validation loss,
and the results jsonl (how examples are cut and scored: tests/data/test_eval_tasks.py).

The end-to-end test builds a model whose answers are known by construction: a character-level tokenizer and
weights that make the model a bigram table following the cycle " abcdefghij" (after ' ' comes 'a', after 'a'
'b', ..., after 'j' ' '), so a passage's last word is predicted exactly when it continues the cycle.
"""
import json
import math
import os

import numpy as np
import pytest

from data.create_tfrecords import create_tfrecords
from data.inputs import eval_dataset
from data.tokenizer import load_for_config
from data import eval_tasks
from evals.tasks import scorer
from infer.run import Predictor
from config import load_config, replace
from tiny import compute_logits, devices_for
from workspace import run_main_in_process

CYCLE = " abcdefghij"


def char_tokenizer_file(path):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    vocab = {"<|endoftext|>": 0, "<|padding|>": 1, **{c: i + 2 for i, c in enumerate(CYCLE)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.save(str(path))
    return vocab


def bigram_weights(cfg, vocab):
    """Our variable names -> weights of a model whose next token after x is next(x) in CYCLE: attention and the
    second MLP are zero; token embeddings are orthogonal, and the first MLP maps token x to a large multiple of
    the embedding of next(x)."""
    d, hidden = cfg.n_embd, 4 * cfg.n_embd
    ones = np.ones([d, 1]) / np.sqrt(d)
    m = np.random.RandomState(0).randn(d, cfg.n_vocab)
    q = np.linalg.qr(m - ones @ (ones.T @ m))[0].T  # orthonormal rows with zero mean: LayerNorm only rescales
    successor = {vocab[c]: vocab[CYCLE[(i + 1) % len(CYCLE)]] for i, c in enumerate(CYCLE)}
    state = {"gpt2/wte": 2.0 * q, "gpt2/wpe": np.zeros([cfg.n_ctx, d]), "gpt2/ln_f/g": np.ones(d),
             "gpt2/ln_f/b": np.zeros(d)}
    a, k = 5.0, 40.0
    for layer in range(cfg.n_layer):
        p = f"gpt2/h{layer}/"
        for norm in ("norm_1", "norm_2"):
            state[p + norm + "/g"], state[p + norm + "/b"] = np.ones(d), np.zeros(d)
        for w in "qkvo":
            state[p + "attn/" + w] = np.zeros([d, d])
        state[p + "attn/compute_output_bias/o_b"] = np.zeros(d)
        fc, fc_b = np.zeros([d, hidden]), np.zeros(hidden)
        proj = np.zeros([hidden, d])
        if layer == 0:
            for x, nxt in successor.items():  # unit x fires (value a*sqrt(d)/2) only for token x
                fc[:, x], fc_b[x] = a * q[x], -a * np.sqrt(d) / 2
                proj[x] = k * q[nxt] / (a * np.sqrt(d) / 2)
        state[p + "mlp/conv1d_main/c_fc/kernel"], state[p + "mlp/conv1d_main/c_fc/bias"] = fc, fc_b
        state[p + "mlp/conv1d_main/c_proj/kernel"], state[p + "mlp/conv1d_main/c_proj/bias"] = proj, np.zeros(d)
    return {name: value.astype(np.float32) for name, value in state.items()}


LAMBADA = [
    ("hij abcdefghij abcd", True),        # the cycle continues: every token of " abcd" is the argmax
    ("efghij abcdefghij abcdefg", True),
    ("j abcdefghij a", True),
    ("cdefghij abcdefghij abd", False),   # after 'b' the model expects 'c'
]


@pytest.fixture(scope="module")
def bigram_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_tasks")
    vocab = char_tokenizer_file(root / "chars.json")
    text_dir = root / "text"
    text_dir.mkdir()
    for i in range(4):  # documents that follow the cycle, from different starting points
        (text_dir / f"doc{i}.txt").write_text((CYCLE * 30)[i * 3:])
    create_tfrecords(input_dir=str(text_dir), output_dir=str(root / "data"), name="chars", mode="documents",
                     encoder_path=str(root / "chars.json"), use_gpt2_tokenizer=False, gpt2_tokenizer_path=None,
                     separator=None, minimum_size=40, show_progress=False)
    registry = root / "configs" / "dataset_configs"
    registry.mkdir(parents=True)
    (registry / "chars.json").write_text(json.dumps({
        "n_vocab": len(vocab), "path": str(root / "data" / "chars_*.tfrecords"),
        "eval_path": str(root / "data" / "chars_*.tfrecords"), "tokenizer_path": str(root / "chars.json"),
        "eos_id": 0, "padding_id": 1}))
    with open(root / "lambada.jsonl", "w") as f:
        for text, _ in LAMBADA:
            f.write(json.dumps({"text": text}) + "\n")
    config = root / "configs" / "bigram.json"
    config.write_text(json.dumps(dict(
        n_layer=2, n_embd=32, n_head=4, n_vocab=16, n_ctx=16, attention_types=[[["global", "local"], 1]],
        local_attention_radius=4, datasets=[["chars", 1, "documents_fixed", 1.0]], model_path=str(root / "run"),
        eval_batch_size=2, eval_steps=2, train_batch_size=2, train_steps=1, steps_per_checkpoint=1, lr=1e-6,
        warmup_steps=0, eval_tasks=["lambada"], lambada_path=str(root / "lambada.jsonl"),
        # float32 as the oracles, on every CPU (precision auto evaluates in bf16 on one with bf16 units; the
        # precision evaluations run in is tests/devices/test_precision.py's)
        precision="float32")))
    cfg = load_config(str(config))
    from tools.hf import write_checkpoint
    write_checkpoint(cfg, bigram_weights(cfg, vocab))  # model.ckpt-0
    return root, str(config), cfg


def oracle_lambada(cfg, checkpoint):
    """Accuracy and perplexity straight from the logits, per the definitions in data/eval_tasks.py."""
    rows, spans = np.ones([len(LAMBADA), cfg.n_ctx], np.int32), []
    for row, (text, _) in enumerate(LAMBADA):
        ids = [2 + CYCLE.index(c) for c in text][-(cfg.n_ctx + 1):]  # contexts are cut from the left
        rows[row, :len(ids) - 1] = ids[:-1]
        n_word = len(text.rsplit(" ", 1)[1]) + 1
        spans.append((ids, range(len(ids) - 1 - n_word, len(ids) - 1)))
    logits = compute_logits(cfg, rows, devices_for(cfg), checkpoint).astype(np.float64)
    logits -= logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    hits = [all(logits[r, t].argmax() == ids[t + 1] for t in span) for r, (ids, span) in enumerate(spans)]
    nlls = [-sum(log_probs[r, t, ids[t + 1]] for t in span) for r, (ids, span) in enumerate(spans)]
    return hits, float(np.exp(np.mean(nlls)))


def oracle_validation_loss(cfg, checkpoint, steps):
    batches = list(eval_dataset(cfg.tokenizer_dataset.eval_path, cfg.n_ctx, cfg.eval_batch_size).take(steps))
    assert len(batches) == steps
    inputs = np.concatenate([x.numpy() for x, _ in batches])
    labels = np.concatenate([y.numpy() for _, y in batches])
    logits = compute_logits(cfg, inputs, devices_for(cfg), checkpoint).astype(np.float64)
    logits -= logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    # Bits per byte's denominator: these labels are characters of the cycle, a byte each, no special token.
    assert set(labels.flatten()) <= {2 + i for i in range(len(CYCLE))}
    return float(-np.take_along_axis(log_probs, labels[..., None], -1).mean())  # equal batches: mean of means


def read_results(root):
    with open(root / "run" / "eval_results.jsonl") as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_eval_reports_lambada_and_validation_loss_with_known_answers(bigram_run):
    root, config, cfg = bigram_run
    checkpoint = str(root / "run" / "model.ckpt-0")
    hits, ppl = oracle_lambada(cfg, checkpoint)
    assert hits == [expected for _, expected in LAMBADA]  # the constructed model knows exactly these answers

    result = run_main_in_process("--model", config, "--eval")
    assert result.returncode == 0, result.stderr
    records = read_results(root)
    assert [(r["task"], r["step"]) for r in records] == [("validation", 0), ("lambada", 0)]
    validation, lambada = records
    assert lambada["lambada_acc"] == 0.75 and lambada["lambada_examples"] == 4
    assert lambada["lambada_ppl"] == pytest.approx(ppl, rel=1e-4)
    assert 1.0 < ppl < 20.0  # one word is wrong, three are nearly certain
    assert validation["batches"] == 2
    assert validation["loss"] == pytest.approx(oracle_validation_loss(cfg, checkpoint, 2), rel=1e-4, abs=1e-5)
    assert validation["perplexity"] == pytest.approx(math.exp(validation["loss"]), rel=1e-6)
    # One byte a token here: bits per byte is the loss in bits. (A byte count off by the rows' first tokens, or
    # nats for bits, fails.)
    assert validation["bits_per_byte"] == pytest.approx(validation["loss"] / math.log(2), rel=1e-6)
    assert "eval task lambada at step 0: lambada_acc 0.7500" in result.stdout

    # Training runs the tasks after each checkpoint too, appending results with the new step.
    trained = run_main_in_process("--model", config)
    assert trained.returncode == 0, trained.stderr
    records = read_results(root)
    assert [(r["task"], r["step"]) for r in records[2:]] == [("validation", 1), ("lambada", 1)]
    assert records[3]["lambada_acc"] == 0.75


def test_lambada_task_equals_the_harness_lambada_openai_on_the_same_file(bigram_run, tmp_path):
    """The `lambada` eval task and lm-eval's own lambada_openai (its YAML, with only the data pointed at the same
    local file) give the same accuracy and perplexity: two paths, one definition (split at the last space, the
    word scored with its space, contexts cut from the left to n_ctx, perplexity exp of the mean word NLL).
    Bugs caught: either path splitting the word from its space, scoring one token too few, or cutting contexts
    from the right."""
    lm_eval = pytest.importorskip("lm_eval")
    from evals import harness
    from tiny import placement_for
    root, _, cfg = bigram_run
    source = os.path.join(os.path.dirname(lm_eval.__file__), "tasks", "lambada", "lambada_openai.yaml")
    local = open(source).read().replace("dataset_path: EleutherAI/lambada_openai\ndataset_name: default\n",
                                        f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: "
                                        f"{root / 'lambada.jsonl'}\n")
    assert "dataset_path: json" in local
    (tmp_path / "lambada_openai.yaml").write_text(local)
    placement, checkpoint = placement_for(cfg), str(root / "run" / "model.ckpt-0")
    with Predictor(cfg, placement, checkpoint) as predictor:
        ours = eval_tasks.lambada(cfg, scorer(cfg, predictor), load_for_config(cfg))
    cfg = replace(cfg, eval_results_path=str(tmp_path / "results.jsonl"), model_path=str(root / "run"))
    theirs = harness.run_harness(cfg, placement, 0, harness.HarnessOptions(
        tasks=("lambada_openai",), include_path=str(tmp_path), output_path=str(tmp_path / "harness.json")))
    assert ours["lambada_acc"] == 0.75 and theirs["lambada_openai"]["acc"] == 0.75
    assert theirs["lambada_openai"]["perplexity"] == pytest.approx(ours["lambada_ppl"], rel=1e-6)
