"""`python -m ladder plan SPEC`: every size's config, from the rules (ladder/rules.py) and the project's planner
(plan/dry_run.py), as a table and an LR-schedule plot; nothing is trained.

Per size the planner gives what `main.py --dry_run` gives for that size's config: the parameters counted on the
training graph, FLOPs per token, and the devices: the smallest mesh (the planner's `smallest_fit`, trying 1, 2, 4,
... devices up to the spec's count) on which the model fits one device's memory with one sequence per micro-batch,
then on that mesh the largest micro-batch per replica that fits, whose count per step is the gradient
accumulation. The sizes' configs are written to OUT/configs/NAME.json (with the datasets they name, in
OUT/configs/dataset_configs/), so that `main.py --model OUT/configs/NAME.json` trains, evaluates or dry-runs a size
by itself; a size that has started keeps the config it started with (a changed spec that would change it is
refused).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
from dataclasses import dataclass
from typing import Optional

from schema import ConfigError, GPTConfig, batch_split, num_microbatches
from modelpath.files import write_json_atomically
from config import config_from_dict, dataset_registry_for, replace, resolve_config_path
from plan import dry_run
from plan.memory_check import available_host_bytes

from ladder import rules as ladder_rules
from ladder.records import PFLOP_DAY, PLAN_FILE, duration
from ladder.spec import LadderError, LadderSpec, short_count



@dataclass
class SizePlan:
    run: ladder_rules.SizeRun
    cfg: GPTConfig                # the size's config, on its mesh, with its micro-batches
    params: dict                  # total / embedding / non_embedding, counted on the training graph
    flops_per_token: float
    memory_per_device: float
    device_bytes: float
    family: str                   # the planner's name for the layout

    @property
    def name(self) -> str:
        return self.run.name

    @property
    def micro_batches(self) -> int:
        return num_microbatches(self.cfg, self.cfg.train_batch_size)

    @property
    def replicas(self) -> int:
        return batch_split(self.cfg)

    @property
    def micro_batch(self) -> int:
        """Sequences per replica in one micro-batch."""
        return self.cfg.train_batch_size // self.replicas // self.micro_batches

    @property
    def flops(self) -> float:
        """The FLOPs this run trains: a branch only its own steps (the trunk trained the ones before its start)."""
        return self.flops_per_token * self.run.trained_steps * self.run.batch_tokens

    def record(self) -> dict:
        r = self.run
        return {"name": r.name, "size": r.size, "kind": r.kind, "trunk": r.trunk, "lineage": r.lineage,
                "start_step": r.start, "keep_steps": list(r.keep_steps), "decay_share": r.decay_share,
                "repeat": r.repeat, "seed": r.seed,
                "target": r.target, "multiple": r.multiple, "n_layer": r.shape.n_layer,
                "n_embd": r.shape.n_embd, "n_head": r.shape.n_head, "non_embedding": self.params["non_embedding"],
                "parameters": self.params["total"], "batch_sequences": r.batch_sequences,
                "batch_tokens": r.batch_tokens, "lr": r.lr, "warmup_steps": r.warmup_steps, "beta2": r.beta2,
                "train_steps": r.steps, "tokens": r.tokens, "eval_every": r.eval_every,
                "flops_per_token": self.flops_per_token, "flops": self.flops, "mesh_shape": self.cfg.mesh_shape,
                "layout": self.cfg.layout, "n_devices": self.cfg.n_devices, "micro_batches": self.micro_batches,
                "micro_batch": self.micro_batch, "model_path": r.model_path, "config_path": r.config_path}


@dataclass
class Ladder:
    spec: LadderSpec
    base: GPTConfig
    base_raw: dict
    sizes: list                   # SizePlan, smallest compute first

    @property
    def flops(self) -> float:
        return sum(s.flops for s in self.sizes)


def load_base(spec: LadderSpec) -> tuple[dict, GPTConfig]:
    """The base config with the spec's overrides and the ladder's evaluation, read and checked."""
    raw = ladder_rules.base_raw(spec)
    eval_steps = spec.eval_steps or raw.get("eval_steps") or 10
    raw["eval_steps"] = eval_steps
    path = resolve_config_path(spec.base)
    cfg = config_from_dict(raw, source=f"base config {os.path.basename(path)} with the ladder's overrides",
                           dataset_config_dir=dataset_registry_for(path))
    if not cfg.datasets:
        raise LadderError(f"the base config {spec.base} has no datasets: the ladder trains every size on the base "
                          f"config's \"datasets\"")
    if not cfg.tokenizer_dataset.eval_path:
        raise LadderError(f"dataset {cfg.tokenizer_dataset.id!r} has no eval_path: the ladder evaluates every size on "
                          f"it; set eval_path in its dataset config (docs/data.md)")
    return raw, cfg


def size_config(ladder_raw: dict, base: GPTConfig, run: ladder_rules.SizeRun, spec: LadderSpec) -> tuple[dict, GPTConfig]:
    raw = dict(ladder_raw, **run.changes(base))
    cfg = config_from_dict(raw, source=f"size {run.name} of ladder {spec.name}",
                           dataset_config_dir=dataset_registry_for(resolve_config_path(spec.base)))
    return raw, cfg


def device_bytes(spec: LadderSpec) -> float:
    """One device's memory: the spec's, or on CPU devices this host's available RAM shared by the devices."""
    if spec.devices.memory:  # checked here, not when the spec is read: `fit` reads specs without TensorFlow
        try:
            return dry_run.parse_bytes(spec.devices.memory)
        except ConfigError as e:
            raise LadderError(f"\"devices\".memory in {spec.path}: {e}") from None
    available = available_host_bytes()
    return (available if available is not None else 2.0 ** 40) / spec.devices.count


def place(cfg: GPTConfig, facts, memory: float, max_devices: int, name: str) -> tuple[GPTConfig, dry_run.Memory, str]:
    """The smallest mesh that fits with one sequence per micro-batch, then the largest micro-batch on it."""
    recompute = cfg.recompute_grad
    one = replace(cfg, tokens_per_mb_per_replica=cfg.n_ctx)
    fit = dry_run.smallest_fit(one, facts, memory, recompute, max_devices=max_devices)
    if fit is None:
        least = dry_run.memory(facts, one, recompute).total
        raise LadderError(
            f"size {name} does not fit {max_devices} device(s) of {dry_run.human_bytes(memory)} even at one sequence "
            f"per micro-batch ({dry_run.human_bytes(least)} on one device, recompute_grad "
            f"{'on' if recompute else 'off'}): give more devices (\"devices\".count) or more memory per device")
    placed = replace(cfg, mesh_shape=fit.mesh_shape, layout=fit.layout)
    per_replica = placed.train_batch_size // batch_split(placed)
    for sequences in sorted((d for d in range(1, per_replica + 1) if per_replica % d == 0), reverse=True):
        candidate = replace(placed, tokens_per_mb_per_replica=None if sequences == per_replica else sequences * cfg.n_ctx)
        used = dry_run.memory(facts, candidate, recompute)
        if used.total <= memory:
            return candidate, used, fit.family
    return replace(placed, tokens_per_mb_per_replica=cfg.n_ctx), fit.memory, fit.family  # smallest_fit's own


def make_ladder(spec: LadderSpec) -> Ladder:
    raw, base = load_base(spec)
    memory = device_bytes(spec)
    sizes, planned = [], {}
    for run in ladder_rules.size_runs(spec, base):
        size_raw, cfg = size_config(raw, base, run, spec)
        if run.size in planned:  # a size's runs differ in duration, seed and checkpoints, not in graph or placement
            first = planned[run.size]
            placed = replace(cfg, mesh_shape=first.cfg.mesh_shape, layout=first.cfg.layout,
                             tokens_per_mb_per_replica=first.cfg.tokens_per_mb_per_replica)
            sizes.append(SizePlan(run, placed, first.params, first.flops_per_token, first.memory_per_device, memory,
                                  first.family))
            continue
        facts = dry_run.collect(cfg)
        placed, used, family = place(cfg, facts, memory, spec.devices.count, run.name)
        plan = dry_run.make_plan(placed, facts=facts)  # the graph's facts do not depend on the mesh
        sizes.append(SizePlan(run, placed, dict(plan.params), plan.flops_per_token, used.total, memory, family))
        planned[run.size] = sizes[-1]
    return Ladder(spec, base, raw, sizes)


# ----------------------------------------------------------------------------------------------------
# Writing the sizes' configs


def _dataset_json(dataset) -> dict:
    out = {"n_vocab": dataset.n_vocab, "path": os.path.abspath(dataset.path)}
    for key in ("eval_path", "tokenizer_path"):
        value = getattr(dataset, key)
        if value:
            out[key] = value if (key == "tokenizer_path" and dataset.tokenizer_is_pretrained) else os.path.abspath(value)
    out["tokenizer_is_pretrained"] = dataset.tokenizer_is_pretrained
    for key in ("eos_id", "padding_id"):
        if getattr(dataset, key) is not None:
            out[key] = getattr(dataset, key)
    return out


def config_json(ladder: Ladder, size: SizePlan) -> dict:
    raw = dict(ladder.base_raw, **size.run.changes(ladder.base))
    raw.update(mesh_shape=size.cfg.mesh_shape, layout=size.cfg.layout,
               tokens_per_mb_per_replica=size.cfg.tokens_per_mb_per_replica)
    return raw


def started(model_path: str) -> bool:
    """Whether a run has a checkpoint (its config is then fixed; a branch's first is its trunk's, copied in)."""
    from modelpath.checkpoints import steps
    return bool(steps(model_path))


def write_configs(ladder: Ladder) -> list[str]:
    """OUT/configs/NAME.json for every run, the datasets beside them, and OUT/SPEC_NAME.plan.json. Refuses (before
    writing anything) when runs that have started, trunks and branches alike, would get configs other than the ones
    they started with, naming them all."""
    folder = os.path.join(ladder.spec.out, "configs")
    wanted = {size.run.config_path: config_json(ladder, size) for size in ladder.sizes}
    refused, changed = [], set()
    for size in ladder.sizes:
        path = size.run.config_path
        if os.path.isfile(path) and started(size.run.model_path):
            with open(path, encoding="utf-8") as f:
                try:
                    existing = json.load(f)
                except ValueError:
                    existing = None
            if existing != wanted[path]:
                refused.append(size)
                changed |= {k for k in set(wanted[path]) | set(existing or {})
                            if (existing or {}).get(k) != wanted[path].get(k)}
    if refused:
        first = refused[0].run
        names = ", ".join(s.name for s in refused)
        raise LadderError(
            f"{'run' if len(refused) == 1 else 'runs'} {names} {'has' if len(refused) == 1 else 'have'} trained (e.g. "
            f"{first.model_path} with {first.config_path}), and the spec now gives "
            f"{'it another config' if len(refused) == 1 else 'them other configs'} ({', '.join(sorted(changed)[:4])} "
            f"changed): restore the spec, or point \"out\" at a new folder for the changed ladder")
    registry = os.path.join(folder, "dataset_configs")
    os.makedirs(registry, exist_ok=True)
    written = []
    for use in ladder.base.datasets:
        _write_json(os.path.join(registry, use.dataset.id + ".json"), _dataset_json(use.dataset))
    for path, raw in wanted.items():
        _write_json(path, raw)
        written.append(path)
    _write_json(os.path.join(ladder.spec.out, PLAN_FILE.format(ladder.spec.name)),
                {"ladder": ladder.spec.name, "spec": ladder.spec.path, "sizes": [s.record() for s in ladder.sizes],
                 "flops_per_token": flops_per_token_curve(ladder)})
    return written


def flops_per_token_curve(ladder: Ladder) -> list:
    """[N, FLOPs per training token] of the shape the ladder's size rule gives N, from 100 to 10T parameters: what
    `fit` needs of the model to turn a compute budget into tokens, written with the plan so that `fit` needs no
    TensorFlow. The project's count (models/flops.py) of each shape on the base architecture."""
    import numpy as np
    from models import flops
    from ladder.shapes import shape_for
    spec, base = ladder.spec, ladder.base
    loose = dataclasses.replace(spec.rules, size_tolerance=0.5)
    curve = {}
    for target in np.logspace(2, 13, 45):
        try:
            shape = shape_for(base, float(target), loose)
        except LadderError:
            continue
        cfg = replace(base, n_layer=shape.n_layer, n_embd=shape.n_embd, n_head=shape.n_head,
                      attention_types=[base.attention_types[i % len(base.attention_types)]
                                       for i in range(shape.n_layer)])
        curve[shape.non_embedding] = flops.training_flops_per_token(cfg)
    return [[float(n), float(f)] for n, f in sorted(curve.items())]


def _write_json(path: str, data) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json_atomically(path, data)


# ----------------------------------------------------------------------------------------------------
# The table and the LR schedule


def measured_rate(model_path: str) -> Optional[float]:
    """A size's achieved model FLOP/s (the whole mesh's) from its TensorBoard scalars: the median of its logged
    throughput; None when it has not run."""
    from modelpath.events import read_scalars
    if not os.path.isdir(model_path):
        return None
    values = [v for _, v in read_scalars(model_path).get("model_flops_per_sec", [])]
    return sorted(values)[len(values) // 2] if values else None


def estimates(ladder: Ladder) -> dict:
    """name -> (seconds, source) for each size: at the spec's model_tflops per device, else at the rate measured in
    that size's model_path, else at the nearest measured size's; None without any."""
    measured = {s.name: measured_rate(s.run.model_path) for s in ladder.sizes}
    found = {}
    for s in ladder.sizes:
        if ladder.spec.devices.model_tflops:
            rate = ladder.spec.devices.model_tflops * 1e12 * s.cfg.n_devices
            found[s.name] = (s.flops / rate, "given")
            continue
        if measured[s.name]:
            found[s.name] = (s.flops / measured[s.name], "measured")
            continue
        others = [(abs(math.log(o.params["non_embedding"] / s.params["non_embedding"])), measured[o.name])
                  for o in ladder.sizes if measured[o.name]]
        found[s.name] = (s.flops / min(others)[1], "nearest measured") if others else None
    return found


def table(ladder: Ladder) -> str:
    spec, times = ladder.spec, estimates(ladder)
    width = max(12, max(len(s.name) for s in ladder.sizes) + 2)
    head = (f"{'run':<{width}}{'N':>10}{'miss':>6}  {'shape':<14}{'batch':>12}{'lr':>9}{'warmup':>7}{'steps':>7}"
            f"  {'from':<{width + 6}}{'tokens':>9}{'tok/N':>6}{'FLOPs':>10}{'pflop-d':>9}  {'mesh':<8}{'micro':>8}"
            f"{'accum':>6}{'time':>9}")
    how = (f"WSD, each run decaying over its last {spec.rules.decay_share:.0%}: per size a trunk and branches from its "
           f"checkpoints" if spec.schedule == "wsd" else "one run per multiple on the base config's schedule")
    lines = [f"ladder {spec.name}: {len(ladder.sizes)} runs from {spec.base} ({how}), devices: up to "
             f"{spec.devices.count} {spec.devices.kind} of {dry_run.human_bytes(ladder.sizes[0].device_bytes)}; "
             f"nothing is trained", head]
    for s in ladder.sizes:
        r, n = s.run, s.params["non_embedding"]
        shape = f"{r.shape.n_layer}x{r.shape.n_embd}/{r.shape.n_head}h"
        time = times.get(s.name)
        origin = f"{r.trunk} @ {r.start}" if r.kind == "branch" and r.start else "step 0"
        lines.append(
            f"{r.name:<{width}}{n:>10,}{n / r.target - 1:>+6.0%}  {shape:<14}{f'{r.batch_sequences}x{s.cfg.n_ctx}':>12}"
            f"{r.lr:>9.3g}{r.warmup_steps:>7}{r.steps:>7}  {origin:<{width + 6}}{short_count(r.tokens):>9}"
            f"{r.tokens / n:>6.0f}"
            f"{s.flops:>10.2e}{s.flops / PFLOP_DAY:>9.1e}  {s.cfg.mesh_shape:<8}{s.micro_batch:>8}{s.micro_batches:>6}"
            f"{duration(time[0]) if time else '?':>9}")
    total = sum(t[0] for t in times.values() if t) if all(times.values()) else None
    sources = sorted({t[1] for t in times.values() if t})
    lines += [
        f"total: {ladder.flops:.2e} FLOPs = {ladder.flops / PFLOP_DAY:.2e} pflop-days"
        + (f", about {duration(total)} of training ({', '.join(sources)} throughput; start-up and evaluations not "
           f"counted)" if total else ", time: ? (give \"devices\".model_tflops, or run a size to measure it)"),
        "N: non-embedding parameters on the training graph; miss: against the target; shape: layers x width / heads; "
        "batch: sequences x context; from: where the run starts (a branch: its trunk's checkpoint at that step); "
        "FLOPs: what the run itself trains; micro: sequences per replica per micro-batch; accum: micro-batches per step",
    ]
    return "\n".join(lines)


def lr_schedules(ladder: Ladder, points: int = 200) -> dict:
    """name -> (tokens, lr) along each run from where it starts (a branch: its trunk's checkpoint), from the
    trainer's own schedule (models/optimizers.py)."""
    import numpy as np
    import tensorflow.compat.v1 as tf
    from models.optimizers import learning_rate
    found = {}
    for s in ladder.sizes:
        first = max(1, s.run.start)  # step 0 has no place on a log axis
        steps = np.unique(np.linspace(first, s.run.steps, points).round().astype(np.int64))
        lr = learning_rate(s.cfg, tf.constant(steps))
        found[s.name] = (steps * s.run.batch_tokens, np.asarray(lr))
    return found


def plot_lr(ladder: Ladder, path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sizes = list(dict.fromkeys(s.run.size for s in ladder.sizes))
    colours = {size: plt.cm.viridis(i / max(1, len(sizes) - 1)) for i, size in enumerate(sizes)}
    runs = {s.name: s.run for s in ladder.sizes}
    for name, (tokens, lr) in lr_schedules(ladder).items():
        run = runs[name]
        if run.repeat:
            continue  # a repeat's schedule is its size's
        labelled = run.size in colours and run.kind != "branch"
        ax.plot(tokens, lr, "--" if run.kind == "branch" else "-", color=colours.get(run.size, "k"), lw=1.2,
                label=run.size if labelled else None)
        if labelled:
            colours[run.size + " labelled"] = None  # one label per size
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("learning rate")
    ax.set_title(f"ladder {ladder.spec.name}: learning-rate schedules")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def check_data(ladder: Ladder) -> None:
    """Every dataset the sizes train on has files, and the eval set too (a run would otherwise fail at its start)."""
    for use in ladder.base.datasets:
        for what, pattern in (("training files", use.dataset.path), ("eval files", use.dataset.eval_path)):
            if pattern and "://" not in pattern and not glob.glob(pattern):
                raise LadderError(f"dataset {use.dataset.id!r} has no {what} matching {pattern}: tokenize them first "
                                  f"(docs/ladder.md gives the commands for the CPU ladder's stdlib512, quickstart.sh "
                                  f"makes stdlib; docs/data.md), or fix the dataset config")

