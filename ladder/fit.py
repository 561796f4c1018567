"""`python -m ladder fit SPEC`: L(N, D) = E + A/N^alpha + B/D^beta (ladder/scaling_law.py) fitted to every evaluation
of every size (N: its non-embedding parameters; D: the tokens trained at that evaluation), with bootstrap intervals;
then what the fit says:

* held-out sizes (`--hold_out`): left out of the fit, their final eval loss predicted and compared;
* compute-optimal N and D for budgets C (`--budget`, FLOPs): C = FLOPs/token x D with the project's FLOP count
  (models/flops.py) of the shape the ladder's rule gives N (ladder/shapes.py), minimising L(N, C / FLOPs/token);
* named configs (`--predict gpt3_XL`): the loss the fit gives their N (counted on their training graph) at
  train_steps x train_batch_size x n_ctx tokens (the ladder's data and tokenizer, carried to that size);
* plots in OUT/fit/SPEC_NAME/: loss against compute per size with the fitted frontier and Kaplan et al.'s L = 2.57 C^-0.048,
  loss against N at fixed tokens per parameter, predicted against measured; and fit.json there.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np

from ladder import scaling_law
from ladder.plan import PFLOP_DAY, load_base
from ladder.shapes import shape_for
from ladder.spec import LadderError, LadderSpec
from ladder.status import results_file, size_records, validation_losses


@dataclass
class Point:
    size: str
    n: float                      # non-embedding parameters
    d: float                      # tokens trained
    loss: float                   # validation loss
    flops_per_token: float
    final: bool                   # the size's last evaluation, at its train_steps

    @property
    def pflop_days(self) -> float:
        return self.d * self.flops_per_token / PFLOP_DAY


def points(records: list) -> list[Point]:
    found = []
    for r in records:
        for step, loss in sorted(validation_losses(results_file(r)).items()):
            if step > 0:
                found.append(Point(r["name"], float(r["non_embedding"]), float(step * r["batch_tokens"]), loss,
                                   float(r["flops_per_token"]), step >= r["train_steps"]))
    return found


class FlopsPerToken:
    """FLOPs per training token of the shape the ladder's rule gives N (interpolated in log-log between shapes)."""

    def __init__(self, spec: LadderSpec):
        from config import replace
        from models import flops
        _, base = load_base(spec)
        loose = spec.rules.__class__(**{**spec.rules.__dict__, "size_tolerance": 0.5})
        ns, fs = [], []
        for target in np.logspace(2, 13, 45):
            try:
                shape = shape_for(base, float(target), loose)
            except LadderError:
                continue
            cfg = replace(base, n_layer=shape.n_layer, n_embd=shape.n_embd, n_head=shape.n_head,
                          attention_types=[base.attention_types[i % len(base.attention_types)]
                                           for i in range(shape.n_layer)])
            ns.append(shape.non_embedding)
            fs.append(flops.training_flops_per_token(cfg))
        order = np.argsort(ns)
        self.log_n, self.log_f = np.log(np.array(ns)[order]), np.log(np.array(fs)[order])

    def __call__(self, n):
        return np.exp(np.interp(np.log(n), self.log_n, self.log_f))

    @property
    def n_range(self) -> tuple:
        return float(np.exp(self.log_n[0])), float(np.exp(self.log_n[-1]))


def compute_optimal(theta, budget: float, fpt: FlopsPerToken) -> dict:
    """The N minimising L(N, C / FLOPs per token(N)) on a fine grid of N."""
    low, high = fpt.n_range
    n = np.logspace(math.log10(low), math.log10(high), 2000)
    d = budget / fpt(n)
    loss = scaling_law.law(theta, n, d)
    i = int(np.argmin(loss))
    return {"n": float(n[i]), "d": float(d[i]), "loss": float(loss[i])}


def frontier(theta, budgets: np.ndarray, fpt: FlopsPerToken) -> np.ndarray:
    return np.array([compute_optimal(theta, c, fpt)["loss"] for c in budgets])


def named_config(name: str) -> dict:
    """N (on the training graph) and D of a model config at its train_steps."""
    from config import load_config
    from models import flops
    from plan import model_graph
    cfg = load_config(name)
    n = model_graph.build(cfg).parameter_count()["non_embedding"]
    d = cfg.train_steps * cfg.train_batch_size * cfg.n_ctx
    return {"n": float(n), "d": float(d), "flops_per_token": flops.training_flops_per_token(cfg), "cfg": cfg}


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def command(spec: LadderSpec, hold_out: list, budgets: list, configs: list, resamples: int, seed: int) -> int:
    from ladder.spec import parse_count
    records = size_records(spec)
    names = [r["name"] for r in records]
    unknown = [h for h in hold_out if h not in names]
    if unknown:
        raise LadderError(f"--hold_out {' '.join(unknown)}: no such size in ladder {spec.name} (its sizes: "
                          f"{', '.join(names)})")
    budgets = [parse_count(b, "a --budget") for b in budgets]
    found = points(records)
    used = [p for p in found if p.size not in hold_out]
    if len({p.size for p in used}) < 2 or len(used) < 5:
        raise LadderError(f"the fit needs evaluations of at least 2 sizes and 5 points; ladder {spec.name} has "
                          f"{len(used)} point(s) of {len({p.size for p in used})} size(s) outside --hold_out: run "
                          f"`python -m ladder run {spec.path}` first")
    result = scaling_law.fit([p.n for p in used], [p.d for p in used], [p.loss for p in used], resamples, seed)
    intervals = result.intervals()
    report = {"ladder": spec.name, "points": len(used), "sizes": sorted({p.size for p in used}, key=names.index),
              "params": result.params, "intervals_95": intervals, "held_out": [], "budgets": [], "configs": []}
    print(f"ladder {spec.name}: L(N, D) = E + A/N^alpha + B/D^beta fitted to {len(used)} evaluations of "
          f"{len(report['sizes'])} sizes ({resamples} bootstrap resamples; 95% intervals)")
    for key in scaling_law.NAMES:
        low, high = intervals[key]
        print(f"  {key:<6}{_fmt(result.params[key]):>10}   [{_fmt(low)}, {_fmt(high)}]")
    stuck = result.at_bounds()
    report["at_bounds"] = stuck
    if stuck:
        ratios = sorted({round(p.d / p.n) for p in used if p.final})
        why = (f"; every run ends at {ratios[0]} tokens/param, so N and D move together: add Chinchilla multiples "
               f"(\"chinchilla_multiples\": [1, 4]) to separate their terms" if len(ratios) == 1 else "")
        print(f"  warning: {', '.join(stuck)} at the bound of the search: these points do not determine them, so the "
              f"compute-optimal split below means nothing (predictions near the points may still hold){why}")
    residuals = [math.log(p.loss) - math.log(result.predict(p.n, p.d)) for p in used]
    print(f"  residuals of log loss on the fitted points: rms {np.sqrt(np.mean(np.square(residuals))):.4f}")
    for size in hold_out:
        final = [p for p in found if p.size == size and p.final]
        if not final:
            print(f"  held out {size}: no final evaluation yet (run the ladder to its end)")
            continue
        p = final[0]
        predicted = float(result.predict(p.n, p.d))
        low, high = result.predict_interval(p.n, p.d)
        error = predicted / p.loss - 1
        report["held_out"].append({"size": size, "n": p.n, "d": p.d, "measured": p.loss, "predicted": predicted,
                                   "interval_95": [low, high], "relative_error": error})
        print(f"  held out {size} (N {p.n:,.0f}, D {p.d:,.0f}): predicted final eval loss {predicted:.4f} "
              f"[{low:.4f}, {high:.4f}], measured {p.loss:.4f}: off by {predicted - p.loss:+.4f} ({error:+.2%})")
    fpt = FlopsPerToken(spec)
    for budget in budgets:
        best = compute_optimal(result.theta, budget, fpt)
        spread = [compute_optimal(t, budget, fpt) for t in result.samples[:50]]
        n_low, n_high = result.interval(np.array([s["n"] for s in spread]))
        report["budgets"].append({"flops": budget, **best, "n_interval_95": [n_low, n_high]})
        print(f"  budget {budget:.3g} FLOPs ({budget / PFLOP_DAY:.3g} pflop-days): compute-optimal N {best['n']:,.0f} "
              f"[{n_low:,.0f}, {n_high:,.0f}], D {best['d']:,.0f} ({best['d'] / best['n']:.1f} tokens/param), "
              f"loss {best['loss']:.4f}")
    for name in configs:
        target = named_config(name)
        predicted = float(result.predict(target["n"], target["d"]))
        low, high = result.predict_interval(target["n"], target["d"])
        report["configs"].append({"config": name, "n": target["n"], "d": target["d"], "predicted": predicted,
                                  "interval_95": [low, high]})
        print(f"  {name}: N {target['n']:,.0f}, D {target['d']:,.0f} ({target['d'] * target['flops_per_token']:.3g} "
              f"FLOPs): predicted loss {predicted:.4f} [{low:.4f}, {high:.4f}] on the ladder's data and tokenizer")
    folder = os.path.join(spec.out, "fit", spec.name)  # specs may share OUT (a multiple added to a ladder)
    os.makedirs(folder, exist_ok=True)
    files = plots(spec, result, found, hold_out, fpt, folder)
    with open(os.path.join(folder, "fit.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {os.path.join(folder, 'fit.json')} and {', '.join(os.path.basename(p) for p in files)}")
    return 0


def plots(spec: LadderSpec, result, found: list, hold_out: list, fpt: FlopsPerToken, folder: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from tools.plot_runs import frontier as kaplan

    sizes = list(dict.fromkeys(p.size for p in found))
    colours = {s: plt.cm.viridis(i / max(1, len(sizes) - 1)) for i, s in enumerate(sizes)}
    files = []

    # Loss against compute, per size, with the fitted frontier and Kaplan et al.'s.
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for s in sizes:
        mine = [p for p in found if p.size == s]
        held = s in hold_out
        ax.plot([p.pflop_days for p in mine], [p.loss for p in mine], "o" + ("--" if held else "-"),
                color=colours[s], mfc="none" if held else colours[s], label=f"{s}{' (held out)' if held else ''}")
    c_low = min(p.pflop_days for p in found) / 3
    c_high = max(p.pflop_days for p in found) * 30
    c = np.logspace(math.log10(c_low), math.log10(c_high), 60)
    ax.plot(c, frontier(result.theta, c * PFLOP_DAY, fpt), "k-", lw=1.2, label="fitted frontier (compute-optimal)")
    ax.plot(c, kaplan(c), "k:", label="Kaplan et al.: L = 2.57 C^-0.048")
    ax.set_xscale("log")
    ax.set_xlabel("compute (petaflop/s-days)")
    ax.set_ylabel("eval loss (nats/token)")
    ax.set_title(f"ladder {spec.name}: loss against compute")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    files.append(_save(fig, folder, "loss_vs_compute.png"))

    # Loss against N at fixed tokens per parameter: the evaluations at the same fraction of each run.
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    ratios = sorted({round(p.d / p.n) for p in found})
    groups = {}
    for p in found:
        key = min(ratios, key=lambda r: abs(math.log(p.d / p.n / r)))
        groups.setdefault(key, []).append(p)
    keys = sorted(groups)
    n = np.logspace(math.log10(min(p.n for p in found) / 1.5), math.log10(max(p.n for p in found) * 3), 60)
    for i, key in enumerate(keys):
        colour = plt.cm.plasma(i / max(1, len(keys)))
        mine = sorted(groups[key], key=lambda p: p.n)
        ratio = float(np.median([p.d / p.n for p in mine]))
        ax.plot([p.n for p in mine], [p.loss for p in mine], "o", color=colour, label=f"{ratio:.0f} tokens/param")
        held = [p for p in mine if p.size in hold_out]
        if held:
            ax.plot([p.n for p in held], [p.loss for p in held], "s", mfc="none", color="k", ms=9)
        ax.plot(n, result.predict(n, ratio * n), "-", color=colour, lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters N")
    ax.set_ylabel("eval loss (nats/token)")
    ax.set_title(f"ladder {spec.name}: loss against N at fixed tokens per parameter (lines: the fit)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    files.append(_save(fig, folder, "loss_vs_params.png"))

    # Predicted against measured.
    fig, ax = plt.subplots(figsize=(5, 5))
    for s in sizes:
        mine = [p for p in found if p.size == s]
        held = s in hold_out
        ax.plot([p.loss for p in mine], [float(result.predict(p.n, p.d)) for p in mine], "s" if held else "o",
                color=colours[s], mfc="none" if held else colours[s], label=f"{s}{' (held out)' if held else ''}")
    lows = [p.loss for p in found]
    line = [min(lows) * 0.98, max(lows) * 1.02]
    ax.plot(line, line, "k:", lw=1)
    ax.set_xlabel("measured eval loss")
    ax.set_ylabel("predicted by the fit")
    ax.set_title(f"ladder {spec.name}: predicted against measured")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    files.append(_save(fig, folder, "predicted_vs_measured.png"))
    return files


def _save(fig, folder: str, name: str) -> str:
    import matplotlib.pyplot as plt
    path = os.path.join(folder, name)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
