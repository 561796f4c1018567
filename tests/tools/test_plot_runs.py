"""tools/plot_runs.py: loss against training tokens and against compute, several runs on one figure, with the
compute-efficient frontier; drawn from a model_path's run_info.json and TensorBoard scalars as training writes them
(its command line on a real run through run_experiment.py: tests/test_run_experiment.py)."""
import json
import os

import numpy as np
import pytest

from modelpath import events, run_info
from tools.plot_runs import PFLOP_DAY, plot

TOKENS_PER_STEP, FLOPS_PER_TOKEN = 4 * 32, 6 * 120_000  # a tiny run's batch x context, and 6 N of its N


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A folder holding `run`: a model_path with run_info.json and the training losses of steps 1 to 3, written
    by the writers training uses (modelpath/run_info.py, modelpath/events.py)."""
    root = tmp_path_factory.mktemp("plot_runs")
    model_path = str(root / "run")
    run_info.write(model_path, {"tokens_per_step": TOKENS_PER_STEP, "flops_per_token": FLOPS_PER_TOKEN}, start_step=0)
    writer = events.summary_writer(events.folder(model_path))
    for step, loss in ((1, 8.3), (2, 7.9), (3, 7.2)):
        events.write_scalars(writer, step, {"loss": loss})
    writer.close()
    return root


def test_plot_runs_draws_loss_against_tokens_and_compute_with_the_frontier(trained_run, tmp_path):
    """Two runs on each figure; the compute line is steps x tokens per step x FLOPs per token in pflop-days, the
    tokens line steps x tokens per step, and the frontier L = 2.57 C^-0.048 spans the runs. (Bug: tokens counted
    in steps, `tokens = steps` in load_run's series: both figures' x off by the batch's tokens.)"""
    root = trained_run
    out = plot([str(root / "run"), str(root / "run")], str(tmp_path), labels=["a", "b"])
    assert sorted(os.path.basename(f) for f in out["files"]) == ["loss_vs_compute.png", "loss_vs_tokens.png"]
    assert all(os.path.getsize(f) > 1000 for f in out["files"])

    losses = events.read_scalars(str(root / "run"))["loss"]
    info = json.loads((root / "run" / "run_info.json").read_text())
    steps = np.array([s for s, _ in losses], float)
    expected_compute = steps * info["tokens_per_step"] * info["flops_per_token"] / PFLOP_DAY

    compute_axes = out["figures"]["compute"].axes[0]
    lines = {line.get_label(): line for line in compute_axes.get_lines()}
    assert {"a", "b"} <= set(lines)  # several runs on one figure
    np.testing.assert_allclose(lines["a"].get_xdata(), expected_compute)
    np.testing.assert_allclose(lines["a"].get_ydata(), [v for _, v in losses])
    frontier = next(line for label, line in lines.items() if label.startswith("frontier"))
    c = np.asarray(frontier.get_xdata())
    np.testing.assert_allclose(frontier.get_ydata(), 2.57 * c ** -0.048)
    assert c.min() < expected_compute.min() and c.max() > expected_compute.max()  # spans the runs

    token_lines = {line.get_label(): line for line in out["figures"]["tokens"].axes[0].get_lines()}
    np.testing.assert_allclose(token_lines["a"].get_xdata(), steps * info["tokens_per_step"])
