"""modelpath/eval_results.py: model_path/eval_results.jsonl, one JSON line per evaluation, appended and read back."""
from modelpath import eval_results


def test_eval_results_are_appended_and_a_line_cut_short_is_skipped(tmp_path):
    """Two evaluations appended read back in order; a last line cut short by a crash is skipped, and a configured
    eval_results_path is used as given. (Bug: the line cut short not caught, `except KeyError`: a crashed run's
    results file unreadable by the ladder and the tools.)"""
    where = eval_results.path(str(tmp_path))
    eval_results.append(where, {"task": "validation", "step": 1, "loss": 2.5})
    eval_results.append(where, {"task": "validation", "step": 2, "loss": 2.0})
    with open(where, "a") as f:
        f.write('{"task": "valid')  # a write cut short by a crash
    assert [(r["step"], r["loss"]) for r in eval_results.read(where)] == [(1, 2.5), (2, 2.0)]
    assert eval_results.path(str(tmp_path), "elsewhere.jsonl") == "elsewhere.jsonl"
