"""`python -m ladder fit SPEC`: L(N, D) = E + A/N^alpha + B/D^beta (ladder/scaling_law.py) fitted to the annealed
evaluations of the ladder's runs (N: non-embedding parameters; D: the tokens the run trained), with a bootstrap over
lineages for the intervals; then what the fit says:

* held-out sizes (`--hold_out n170K`): every run of those sizes left out of the fit, their annealed losses predicted
  (with intervals that hold a new run's own noise) and compared;
* compute-optimal N and D for budgets C (`--budget`, FLOPs): C = FLOPs/token x D with the project's FLOP count of
  the shape the ladder's rule gives N (written by `plan`), minimising L(N, C / FLOPs/token);
* named configs (`--predict gpt3_XL`): the loss the fit gives their N (counted on their training graph) at
  train_steps x train_batch_size x n_ctx tokens (the ladder's data and tokenizer, carried to that size);
* plots in OUT/fit/SPEC_NAME/: loss against compute per size with the fitted frontier and Kaplan et al.'s
  L = 2.57 C^-0.048, loss against tokens per size with the fit's curves, loss against N at fixed tokens per
  parameter, predicted against measured; and fit.json there.

Only annealed points are fitted: the end of each run, a WSD branch's or trunk's or a run of the base schedule's.
An evaluation in the middle of a run is not the end of a run of that length (its learning rate has not decayed), and
fitting it as one lets the D term take the schedule's shape. The run-to-run noise comes from repeats: runs of one
size and duration on two data orders (the spec's "repeats").

It reads what `plan` and `run` wrote (OUT/SPEC_NAME.plan.json, each run's eval results): no TensorFlow, except
for --predict, which counts a config's training graph.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ladder import scaling_law
from modelpath.files import write_json_atomically
from ladder.records import PFLOP_DAY, duration, read_plan, results_file, validation_losses
from ladder.spec import LadderError, LadderSpec, parse_count


@dataclass
class Point:
    run: str
    size: str
    lineage: str                  # the runs sharing an initialisation and data order (a trunk and its branches)
    n: float                      # non-embedding parameters
    d: float                      # tokens trained
    loss: float                   # validation loss
    flops_per_token: float
    multiple: float
    repeat: int                   # 0, or the repeat's number (another data order)
    annealed: bool                # the run's end (its train_steps): its learning rate decayed

    @property
    def pflop_days(self) -> float:
        return self.d * self.flops_per_token / PFLOP_DAY


def evaluations(records: list) -> list[Point]:
    """Every evaluation of every run (annealed: the one at its train_steps)."""
    found = []
    for r in records:
        for step, loss in sorted(validation_losses(results_file(r)).items()):
            if step > 0:
                found.append(Point(r["name"], r.get("size") or r["name"].split("-")[0], r.get("lineage") or r["name"],
                                   float(r["non_embedding"]), float(step * r["batch_tokens"]), loss,
                                   float(r["flops_per_token"]), float(r["multiple"]), int(r.get("repeat") or 0),
                                   step >= r["train_steps"]))
    return found


def repeat_pairs(annealed: list) -> list:
    """(loss, its repeat's loss) for each annealed point whose size and duration another data order also ran."""
    first = {(p.size, p.multiple): p for p in annealed if p.repeat == 0}
    return [(first[(p.size, p.multiple)].loss, p.loss) for p in annealed
            if p.repeat and (p.size, p.multiple) in first]


class FlopsPerToken:
    """FLOPs per training token of the shape the ladder's rule gives N, interpolated in log-log between the shapes
    `plan` counted (OUT/SPEC_NAME.plan.json's "flops_per_token")."""

    def __init__(self, curve: list):
        ns, fs = zip(*curve)
        self.log_n, self.log_f = np.log(np.array(ns)), np.log(np.array(fs))

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
    """N (on the training graph) and D of a model config at its train_steps (imports TensorFlow)."""
    from config import load_config
    from models import flops
    from plan import model_graph
    cfg = load_config(name)
    n = model_graph.build(cfg).parameter_count()["non_embedding"]
    d = cfg.train_steps * cfg.train_batch_size * cfg.n_ctx
    return {"n": float(n), "d": float(d), "flops_per_token": flops.training_flops_per_token(cfg), "cfg": cfg}


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _interval(found: Optional[tuple], digits: int = 4) -> str:
    return "[no interval: degenerate fit]" if found is None else f"[{found[0]:.{digits}f}, {found[1]:.{digits}f}]"


class BootstrapProgress:
    """A line every tenth of the resamples (and at the last): done, rate and ETA."""

    def __init__(self, out=None):
        self.out, self.started, self.shown = out or sys.stdout, time.monotonic(), 0

    def __call__(self, done: int, total: int) -> None:
        if done * 10 // total == self.shown and done != total:
            return
        self.shown = done * 10 // total
        elapsed = time.monotonic() - self.started
        rate = done / elapsed if elapsed > 0 else float("inf")
        print(f"  bootstrap {done}/{total} resamples, {rate:.1f}/s, eta {duration((total - done) / rate)}",
              file=self.out, flush=True)


def command(spec: LadderSpec, hold_out: list, budgets: list, configs: list, resamples: int, seed: int) -> int:
    plan = read_plan(spec)
    if not plan or not plan.get("sizes"):
        raise LadderError(f"ladder {spec.name} has no plan in {spec.out}: run `python -m ladder run {spec.path}` (or "
                          f"`plan`) first")
    if "flops_per_token" not in plan:
        raise LadderError(f"{spec.out}'s plan predates fit's FLOP counts: run `python -m ladder plan {spec.path}` "
                          f"to write them (the runs are not touched)")
    records = plan["sizes"]
    sizes = list(dict.fromkeys(r.get("size") or r["name"] for r in records))
    for name in hold_out:
        if name not in sizes:
            owner = next((r.get("size") for r in records if r["name"] == name), None)
            hint = (f": --hold_out takes sizes, and {name} is a run of {owner} (hold out {owner} to leave out all its "
                    f"runs)" if owner else f" (its sizes: {', '.join(sizes)})")
            raise LadderError(f"--hold_out {name}: no such size in ladder {spec.name}{hint}")
    budgets = [parse_count(b, "a --budget") for b in budgets]
    found = evaluations(records)
    annealed = [p for p in found if p.annealed]
    used = [p for p in annealed if p.size not in hold_out]
    if len({p.size for p in used}) < 2 or len(used) < 5:
        raise LadderError(f"the fit needs annealed evaluations (the ends of runs) of at least 2 sizes and 5 points; "
                          f"ladder {spec.name} has {len(used)} of {len({p.size for p in used})} size(s) outside "
                          f"--hold_out: run `python -m ladder run {spec.path}` first")
    pairs = repeat_pairs(annealed)
    noise = scaling_law.run_noise(pairs)
    print(f"ladder {spec.name}: L(N, D) = E + A/N^alpha + B/D^beta fitted to the {len(used)} annealed evaluations "
          f"(the ends of runs) of {len({p.size for p in used})} sizes in {len({p.lineage for p in used})} lineages",
          flush=True)
    result = scaling_law.fit([p.n for p in used], [p.d for p in used], [p.loss for p in used],
                             [p.lineage for p in used], resamples, seed, noise, progress=BootstrapProgress())
    intervals = result.intervals()
    report = {"ladder": spec.name, "points": len(used), "sizes": sorted({p.size for p in used}, key=sizes.index),
              "lineages": result.n_groups, "params": result.params, "intervals_95": intervals,
              "degenerate": result.degenerate, "run_noise": noise, "repeat_pairs": len(pairs), "held_out": [],
              "budgets": [], "configs": []}
    if not result.degenerate:
        print(f"  95% intervals from {resamples} bootstrap resamples of the lineages (a trunk with its branches, or a "
              f"run), each refitted from fresh starts")
        if len({p.size for p in used}) < 4:
            print(f"  note: {len({p.size for p in used})} sizes: every resample holds three sizes' lineages, so it "
                  f"varies only where a size has several (repeats); fit four sizes or more for intervals that hold "
                  f"the fit's own uncertainty")
    for key in scaling_law.NAMES:
        shown = "" if intervals[key] is None else f"   [{_fmt(intervals[key][0])}, {_fmt(intervals[key][1])}]"
        print(f"  {key:<6}{_fmt(result.params[key]):>10}{shown}")
    if result.degenerate:
        ratios = sorted({round(p.d / p.n) for p in used})
        why = (f"; every run ends at {ratios[0]} tokens/param, so N and D move together: add Chinchilla multiples "
               f"or branches to separate their terms" if len(ratios) == 1 else "")
        them = "them" if len(result.degenerate) > 1 else "it"
        print(f"  warning: degenerate fit: {', '.join(result.degenerate)} at the bound of the search, so these points "
              f"do not determine {them}: no intervals, and the compute-optimal split below means nothing{why}")
    if "E" in result.degenerate:
        report["e_profile"] = e_profile(used, [p for p in annealed if p.size in hold_out])
    entropy = data_entropy(spec, records)
    if entropy is not None:
        report["data_entropy"] = entropy
        print(f"  the data's entropy per token, recorded beside its files ({entropy['dataset']}): {entropy['nats']:.4f} "
              f"nats, the lowest loss any model can reach; the fitted E is {result.params['E'] / entropy['nats'] - 1:+.1%} "
              f"off it")
    residuals = [math.log(p.loss) - math.log(result.predict(p.n, p.d)) for p in used]
    print(f"  residuals of log loss on the fitted points: rms {np.sqrt(np.mean(np.square(residuals))):.4f}")
    if noise is not None:
        print(f"  run-to-run noise: {noise:.2%} of the loss (standard deviation), from {len(pairs)} annealed points "
              f"trained again on another data order; the prediction intervals hold it")
    else:
        print("  run-to-run noise: not measured (no repeats in the spec), so the intervals below leave out a new "
              "run's own noise")
    for size in hold_out:
        mine = sorted((p for p in annealed if p.size == size), key=lambda p: (p.repeat, p.d))
        if not mine:
            print(f"  held out {size}: no annealed evaluation yet (run the ladder to its end)")
            continue
        for p in mine:
            predicted = float(result.predict(p.n, p.d))
            interval = result.predict_interval(p.n, p.d, seed)
            error = predicted / p.loss - 1
            inside = interval is not None and interval[0] <= p.loss <= interval[1]
            report["held_out"].append({"size": size, "run": p.run, "n": p.n, "d": p.d, "measured": p.loss,
                                       "predicted": predicted, "interval_95": interval, "relative_error": error,
                                       "inside": inside})
            where = "" if interval is None else f", {'inside' if inside else 'outside'} its interval"
            print(f"  held out {p.run} (N {p.n:,.0f}, D {p.d:,.0f}): predicted eval loss {predicted:.4f} "
                  f"{_interval(interval)}, measured {p.loss:.4f}: off by {predicted - p.loss:+.4f} ({error:+.2%})"
                  f"{where}")
    fpt = FlopsPerToken(plan["flops_per_token"])
    for budget in budgets:
        best = compute_optimal(result.theta, budget, fpt)
        spread = [compute_optimal(t, budget, fpt)["n"] for t in result.samples[:50]]
        n_interval = result.interval(np.array(spread))
        report["budgets"].append({"flops": budget, **best, "n_interval_95": n_interval})
        shown = "" if n_interval is None else f" [{n_interval[0]:,.0f}, {n_interval[1]:,.0f}]"
        print(f"  budget {budget:.3g} FLOPs ({budget / PFLOP_DAY:.3g} pflop-days): compute-optimal N {best['n']:,.0f}"
              f"{shown}, D {best['d']:,.0f} ({best['d'] / best['n']:.1f} tokens/param), loss {best['loss']:.4f}")
    for name in configs:
        target = named_config(name)
        predicted = float(result.predict(target["n"], target["d"]))
        interval = result.predict_interval(target["n"], target["d"], seed)
        report["configs"].append({"config": name, "n": target["n"], "d": target["d"], "predicted": predicted,
                                  "interval_95": interval})
        print(f"  {name}: N {target['n']:,.0f}, D {target['d']:,.0f} ({target['d'] * target['flops_per_token']:.3g} "
              f"FLOPs): predicted loss {predicted:.4f} {_interval(interval)} on the ladder's data and tokenizer")
    folder = os.path.join(spec.out, "fit", spec.name)  # specs may share OUT (a multiple added to a ladder)
    os.makedirs(folder, exist_ok=True)
    files = plots(spec, result, found, hold_out, fpt, folder)
    write_json_atomically(os.path.join(folder, "fit.json"), report)
    print(f"wrote {os.path.join(folder, 'fit.json')} and {', '.join(os.path.basename(p) for p in files)}")
    return 0


def data_entropy(spec: LadderSpec, records: list) -> Optional[dict]:
    """{"dataset", "nats"}: the entropy per token the ladder's evaluation data records beside its files (a synthetic
    language's, data/facts.py: NAME.entropy.json), else None. Read from the first run's config and its dataset
    config as `plan` wrote them (OUT/configs/), so no TensorFlow."""
    from data.facts import read_entropy
    try:
        with open(os.path.join(spec.out, "configs", f"{records[0]['name']}.json"), encoding="utf-8") as f:
            dataset = json.load(f)["datasets"][0][0]
        with open(os.path.join(spec.out, "configs", "dataset_configs", f"{dataset}.json"), encoding="utf-8") as f:
            eval_path = json.load(f).get("eval_path")
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    nats = read_entropy(eval_path) if isinstance(eval_path, str) else None
    return None if nats is None else {"dataset": dataset, "nats": nats}


E_HELD = (0.001, 0.5, 1.0, 1.5, 2.0)  # E values of the profile a fit with E at a bound prints


def e_profile(used: list, held_out: list) -> list:
    """When the fit leaves E at a bound: the fit again with E held at each of E_HELD, its objective and the held-out
    runs' predictions, so the reader sees how far E can move before the points object (and whether the predictions
    care). Printed, and returned for fit.json."""
    n, d, loss = ([getattr(p, k) for p in used] for k in ("n", "d", "loss"))
    rows = []
    print("  E is not determined by these points; the fit again with E held (objective: lower is better):")
    for e_value in E_HELD:
        objective, theta = scaling_law.fit_with_e_held(n, d, loss, e_value)
        predicted = [float(scaling_law.law(theta, p.n, p.d)) for p in held_out]
        rows.append({"E": e_value, "objective": objective, **scaling_law.as_params(theta), "held_out": predicted})
        shown = ", ".join(f"{p.run} {v:.3f}" for p, v in zip(held_out, predicted))
        print(f"    E {e_value:<5g} objective {objective:9.2f}  alpha {theta[3]:.3f}  beta {theta[4]:.3f}"
              f"{'  predicts ' + shown if shown else ''}")
    return rows


def plots(spec: LadderSpec, result, found: list, hold_out: list, fpt: FlopsPerToken, folder: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from tools.plot_runs import frontier as kaplan

    annealed = [p for p in found if p.annealed]
    sizes = list(dict.fromkeys(p.size for p in found))
    colours = {s: plt.cm.viridis(i / max(1, len(sizes) - 1)) for i, s in enumerate(sizes)}
    files = []

    def label(size):
        return f"{size}{' (held out)' if size in hold_out else ''}"

    def trunk_curve(size):
        """The evaluations along the size's longest run of the first data order (not annealed but at its end)."""
        mine = [p for p in found if p.size == size and p.repeat == 0]
        longest = max(mine, key=lambda p: p.d).run
        return sorted((p for p in mine if p.run == longest), key=lambda p: p.d)

    def markers(ax, x_of, y_of=lambda p: p.loss):
        for s in sizes:
            held = s in hold_out
            for repeat in (0, 1):
                mine = sorted((p for p in annealed if p.size == s and bool(p.repeat) == bool(repeat)), key=x_of)
                if mine:
                    ax.plot([x_of(p) for p in mine], [y_of(p) for p in mine], "D" if repeat else "o",
                            color=colours[s], mfc="none" if held or repeat else colours[s], ms=6 if repeat else 5,
                            label=None if repeat else label(s))

    # Loss against compute, per size: its trunk's evaluations (thin), its annealed points, the fitted frontier.
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for s in sizes:
        curve = trunk_curve(s)
        ax.plot([p.pflop_days for p in curve], [p.loss for p in curve], "-", color=colours[s], lw=0.8, alpha=0.5)
    markers(ax, lambda p: p.pflop_days)
    c_low = min(p.pflop_days for p in found) / 3
    c_high = max(p.pflop_days for p in found) * 30
    c = np.logspace(math.log10(c_low), math.log10(c_high), 60)
    ax.plot(c, frontier(result.theta, c * PFLOP_DAY, fpt), "k-", lw=1.2, label="fitted frontier (compute-optimal)")
    ax.plot(c, kaplan(c), "k:", label="Kaplan et al.: L = 2.57 C^-0.048")
    files.append(_finish(fig, ax, "compute (petaflop/s-days)", f"ladder {spec.name}: annealed loss against compute\n"
                         f"(lines: each trunk's evaluations, not annealed; diamonds: repeats)",
                         os.path.join(folder, "loss_vs_compute.png")))

    # Loss against tokens, per size: the trunk's evaluations, the annealed points, and the fit's L(N, D) through them.
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for s in sizes:
        curve = trunk_curve(s)
        ax.plot([p.d for p in curve], [p.loss for p in curve], "-", color=colours[s], lw=0.8, alpha=0.5)
        if not any(p.size == s for p in annealed):  # a size still training: no annealed end to draw the fit through
            continue
        n = curve[0].n
        d = np.logspace(math.log10(min(p.d for p in annealed if p.size == s) / 1.5),
                        math.log10(max(p.d for p in annealed if p.size == s) * 1.5), 40)
        ax.plot(d, result.predict(n, d), "--", color=colours[s], lw=1)
    markers(ax, lambda p: p.d)
    files.append(_finish(fig, ax, "training tokens D", f"ladder {spec.name}: loss against tokens\n(thin: each trunk's "
                         f"evaluations; dots: annealed ends; dashed: the fit)",
                         os.path.join(folder, "loss_vs_tokens.png")))

    # Loss against N at fixed tokens per parameter: the annealed points of each multiple.
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    multiples = sorted({p.multiple for p in annealed})
    n = np.logspace(math.log10(min(p.n for p in annealed) / 1.5), math.log10(max(p.n for p in annealed) * 3), 60)
    for i, multiple in enumerate(multiples):
        colour = plt.cm.plasma(i / max(1, len(multiples)))
        mine = sorted((p for p in annealed if p.multiple == multiple), key=lambda p: p.n)
        ratio = float(np.median([p.d / p.n for p in mine]))
        ax.plot([p.n for p in mine], [p.loss for p in mine], "o", color=colour, label=f"{ratio:.0f} tokens/param")
        held = [p for p in mine if p.size in hold_out]
        if held:
            ax.plot([p.n for p in held], [p.loss for p in held], "s", mfc="none", color="k", ms=9)
        ax.plot(n, result.predict(n, ratio * n), "-", color=colour, lw=1)
    files.append(_finish(fig, ax, "non-embedding parameters N", f"ladder {spec.name}: annealed loss against N at fixed "
                         f"tokens per parameter\n(lines: the fit; squares: held out)",
                         os.path.join(folder, "loss_vs_params.png")))

    # Predicted against measured.
    fig, ax = plt.subplots(figsize=(5, 5))
    markers(ax, lambda p: p.loss, lambda p: float(result.predict(p.n, p.d)))
    lows = [p.loss for p in annealed]
    line = [min(lows) * 0.98, max(lows) * 1.02]
    ax.plot(line, line, "k:", lw=1)
    files.append(_finish(fig, ax, "measured eval loss (annealed)", f"ladder {spec.name}: predicted against measured",
                         os.path.join(folder, "predicted_vs_measured.png"), ylabel="predicted by the fit", log_x=False))
    return files


def _finish(fig, ax, xlabel: str, title: str, path: str, ylabel: str = "eval loss (nats/token)",
            log_x: bool = True) -> str:
    """Every plot's axes (x logarithmic unless `log_x` is False, labels, title, grid, legend), saved to `path` and
    closed; returns `path`."""
    import matplotlib.pyplot as plt
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both" if log_x else "major", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
