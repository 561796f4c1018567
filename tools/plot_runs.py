"""Plot training runs: loss against training tokens and against compute, several runs on one figure.

    python tools/plot_runs.py runs/default                         # -> runs/default/plots/*.png
    python tools/plot_runs.py runs/small runs/medium --labels small medium --out plots/

Reads each model_path's TensorBoard scalars (`loss`, and `eval/loss` when the run evaluated) and its
`run_info.json` (written by main.py when training starts: tokens per step and model FLOPs per token from the
model's shape, models/flops.py). Training tokens are step x tokens per step; compute is tokens x FLOPs per
token, in petaflop/s-days (1 pflop-day = 1e15 x 86400 FLOPs). The compute plot also draws the compute-efficient
frontier L = 2.57 * C^-0.048 (C in pflop-days; Kaplan et al. 2020, fig. 1) for reference.

Writes loss_vs_tokens.png and loss_vs_compute.png. For a run trained before run_info.json existed, pass
--model CONFIG (its config) to derive the same numbers.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from console.arguments import ArgumentParser  # noqa: E402
from modelpath import events, run_info  # noqa: E402

PFLOP_DAY = 1e15 * 86400
FRONTIER_SCALE, FRONTIER_EXPONENT = 2.57, -0.048


class PlotError(ValueError):
    """A run that cannot be plotted; one line naming the fix."""


def frontier(pflop_days: np.ndarray) -> np.ndarray:
    """The compute-efficient frontier's loss at C pflop-days: L = 2.57 * C^-0.048."""
    return FRONTIER_SCALE * np.power(pflop_days, FRONTIER_EXPONENT)


def run_numbers(model_path: str, model: str | None = None) -> dict:
    """tokens_per_step and flops_per_token of a run, from its run_info.json or from --model's config."""
    info = run_info.read(model_path)
    if info is not None and not {"tokens_per_step", "flops_per_token"} <= set(info):
        info = None  # written by a damaged or foreign run_info.json: as good as none
    if info is None and model:
        from config import load_config
        from train.job import run_description
        info = run_description(load_config(model))
    if info is None:
        raise PlotError(f"{model_path} has no usable run_info.json (main.py writes it when training starts): "
                        f"train it with this version, or pass --model CONFIG to plot_runs.py")
    return {"tokens_per_step": float(info["tokens_per_step"]), "flops_per_token": float(info["flops_per_token"])}


def load_run(model_path: str, model: str | None = None) -> dict:
    """Arrays for one run: steps, tokens, pflop_days, loss (training), and the same for eval when present."""
    if not os.path.isdir(model_path):
        raise PlotError(f"{model_path} is not a folder: pass the model_path of a training run")
    numbers = run_numbers(model_path, model)
    scalars = events.read_scalars(model_path)
    if not scalars.get("loss"):
        raise PlotError(f"{model_path} has no 'loss' scalars in its TensorBoard event files: train it first")

    def series(points):
        steps = np.array([s for s, _ in points], dtype=np.float64)
        tokens = steps * numbers["tokens_per_step"]
        return {"steps": steps, "tokens": tokens, "pflop_days": tokens * numbers["flops_per_token"] / PFLOP_DAY,
                "loss": np.array([v for _, v in points], dtype=np.float64)}

    run = {"model_path": model_path, **numbers, "train": series(scalars["loss"])}
    eval_folder = events.folder(model_path, evaluation=True)
    eval_loss = events.read_scalars(eval_folder).get("loss") if os.path.isdir(eval_folder) else None
    if eval_loss:
        run["eval"] = series(eval_loss)
    return run


def plot(model_paths: list[str], out_dir: str | None = None, labels: list[str] | None = None,
         model: str | None = None, show_eval: bool = True) -> dict:
    """Draws both figures and writes them as PNGs. Returns {"runs": {label: run}, "frontier": (C, L),
    "figures": {"tokens": Figure, "compute": Figure}, "files": [paths]} for callers and tests."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not model_paths:
        raise PlotError("no runs given: pass one or more model_path folders")
    labels = list(labels) if labels else [os.path.basename(os.path.normpath(p)) for p in model_paths]
    if len(labels) != len(model_paths):
        raise PlotError(f"{len(labels)} labels for {len(model_paths)} runs: give one label per run")
    runs = {label: load_run(path, model) for label, path in zip(labels, model_paths)}
    out_dir = out_dir or os.path.join(model_paths[0], "plots")
    os.makedirs(out_dir, exist_ok=True)

    figures, files = {}, []
    for key, x_name, x_label in (("tokens", "tokens", "training tokens"),
                                 ("compute", "pflop_days", "compute (petaflop/s-days)")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, run in runs.items():
            line, = ax.plot(run["train"][x_name], run["train"]["loss"], label=label)
            if show_eval and "eval" in run:
                ax.plot(run["eval"][x_name], run["eval"]["loss"], "o--", color=line.get_color(), markersize=4,
                        label=f"{label} (eval)")
        if key == "compute":
            lows = [run["train"]["pflop_days"].min() for run in runs.values()]
            highs = [run["train"]["pflop_days"].max() for run in runs.values()]
            c = np.logspace(np.log10(min(lows)) - 0.2, np.log10(max(highs)) + 0.2, 100)
            ax.plot(c, frontier(c), "k:", label="frontier L = 2.57 C^-0.048")
            frontier_line = (c, frontier(c))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(x_label)
        ax.set_ylabel("loss (nats/token)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"loss against {x_label}")
        fig.tight_layout()
        path = os.path.join(out_dir, f"loss_vs_{key}.png")
        fig.savefig(path, dpi=120)
        figures[key] = fig
        files.append(path)
    return {"runs": runs, "frontier": frontier_line, "figures": figures, "files": files}


def main(argv=None) -> int:
    p = ArgumentParser(prog="python tools/plot_runs.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_paths", nargs="+", help="model_path folders of training runs")
    p.add_argument("--labels", nargs="+", help="one legend label per run (default: folder names)")
    p.add_argument("--out", help="folder for the PNGs (default: <first model_path>/plots)")
    p.add_argument("--model", help="config of runs that have no run_info.json (trained before it existed)")
    p.add_argument("--no_eval", action="store_true", help="leave out eval loss points")
    args = p.parse_args(argv)
    try:
        result = plot(args.model_paths, args.out, args.labels, args.model, show_eval=not args.no_eval)
    except PlotError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for label, run in result["runs"].items():
        train = run["train"]
        print(f"{label}: {len(train['steps'])} points, step {int(train['steps'][-1])}, "
              f"{train['tokens'][-1]:,.0f} tokens, {train['pflop_days'][-1]:.3g} pflop-days, "
              f"last loss {train['loss'][-1]:.4f}")
    for path in result["files"]:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
