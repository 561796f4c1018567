"""ladder/status.py (`python -m ladder status`): each run's row from what its model_path holds, on model_paths
written here (the real ladder's, trained: tests/ladder/test_run.py::test_status_reads_the_model_paths)."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

from ladder import records, status
from modelpath import eval_results, events

STEPS, BATCH_TOKENS = 40, 256


def a_run(root, name: str, checkpoints=(), evaluated=(), tokens_per_s=None) -> dict:
    """A run's plan record and a model_path holding checkpoints (their index files), validation losses and, when
    given, the tokens/s training logged at its last checkpoint."""
    model_path = os.path.join(str(root), name)
    os.makedirs(model_path)
    for step in checkpoints:
        open(os.path.join(model_path, f"model.ckpt-{step}.index"), "w").close()
    for step in evaluated:
        eval_results.append(eval_results.path(model_path), {"task": "validation", "step": step, "loss": 8 - step / 10})
    if tokens_per_s:
        writer = events.summary_writer(model_path)
        events.write_scalars(writer, checkpoints[-1], {"tokens_per_sec": tokens_per_s, "loss": 6.0})
        writer.close()
    return {"name": name, "model_path": model_path, "config_path": os.path.join(str(root), name + ".json"),
            "non_embedding": 6600, "batch_tokens": BATCH_TOKENS, "flops_per_token": 1e5, "train_steps": STEPS}


def test_a_run_is_done_once_trained_and_evaluated_at_its_end(tmp_path):
    """Four runs: one trained and evaluated at its end (done, 100%), one cut off at step 20 of 40 (half its tokens,
    the eta of the other half at its logged tokens/s), one trained to its end whose final evaluation is missing
    (not done: `run` evaluates it next) and one not started. (Bugs: a run counted done on its last checkpoint alone,
    `finished = bool(saved) and saved[-1] >= steps`: the missing evaluation never noticed; the eval loss shown from
    the first evaluation, `evals[min(evals)]`.)"""
    runs = [a_run(tmp_path, "done", checkpoints=(20, 40), evaluated=(20, 40)),
            a_run(tmp_path, "cut", checkpoints=(20,), evaluated=(20,), tokens_per_s=512.0),
            a_run(tmp_path, "unevaluated", checkpoints=(20, 40), evaluated=(20,)),
            a_run(tmp_path, "new")]
    spec = SimpleNamespace(out=str(tmp_path), name="toy")
    with open(os.path.join(str(tmp_path), records.PLAN_FILE.format("toy")), "w") as f:
        json.dump({"sizes": runs}, f)
    rows = {r["name"]: status.overview(r) for r in status.size_records(spec)}
    assert rows["done"]["state"] == "done" and rows["done"]["fraction"] == 1.0 and rows["done"]["eta"] is None
    assert rows["done"]["eval_loss"] == 8 - 40 / 10 and rows["done"]["eval_step"] == 40
    cut = rows["cut"]
    assert cut["state"] == f"step 20/{STEPS}" and cut["fraction"] == 0.5 and cut["train_loss"] == 6.0
    assert cut["eta"] == (STEPS - 20) * BATCH_TOKENS / 512.0
    assert rows["unevaluated"]["state"] == f"step {STEPS}/{STEPS}" and rows["unevaluated"]["eval_step"] == 20
    assert rows["new"]["state"] == "not started" and rows["new"]["fraction"] == 0
    text = status.table(spec)
    assert "1/4 runs done" in text and f"eta of the sizes under way {records.duration(cut['eta'])}" in text
    for name, row in rows.items():
        line = next(line for line in text.splitlines() if line.startswith(name + " "))
        assert line.endswith(row["state"]) and f"{100 * row['fraction']:.0f}%" in line, line
