"""`python -m ladder status SPEC`: the training overview of every run, read from what its model_path holds (and
works while sizes train, here or on a cluster): run_info.json (tokens per step, FLOPs per token), the TensorBoard
scalars (step, loss, tokens/s, MFU), the checkpoints and eval_results.jsonl. The ladder's OUT/SPEC_NAME.plan.json
names the sizes and their targets (`plan` or `run` writes it)."""
from __future__ import annotations

import os

from ladder.records import PFLOP_DAY, duration, read_plan, results_file, validation_losses  # noqa: F401
from ladder.spec import LadderSpec


def size_records(spec: LadderSpec) -> list[dict]:
    """The runs as `plan` recorded them (planned now when it has not run)."""
    found = read_plan(spec)
    if found and found.get("sizes"):
        return found["sizes"]
    from ladder.plan import make_ladder
    return [size.record() for size in make_ladder(spec).sizes]


def overview(record: dict) -> dict:
    """One size's row: what its model_path says."""
    from modelpath.checkpoints import steps as checkpoint_steps
    from modelpath import run_info
    from modelpath.events import read_scalars
    path = record["model_path"]
    info = run_info.read(path) if os.path.isdir(path) else None
    tokens_per_step = float((info or {}).get("tokens_per_step") or record["batch_tokens"])
    flops_per_token = float((info or {}).get("flops_per_token") or record["flops_per_token"])
    steps = int((info or {}).get("train_steps") or record["train_steps"])
    scalars = read_scalars(path) if os.path.isdir(path) else {}
    saved = checkpoint_steps(path)
    logged = scalars.get("loss", [])
    step = max([saved[-1] if saved else 0, logged[-1][0] if logged else 0])
    evals = validation_losses(results_file(record))

    def last(tag):
        values = scalars.get(tag)
        return values[-1][1] if values else None

    tokens_per_s = last("tokens_per_sec")
    done_tokens = step * tokens_per_step
    target = steps * tokens_per_step
    finished = bool(saved) and saved[-1] >= steps and steps in evals
    eta = None
    if not finished and tokens_per_s:
        eta = (target - done_tokens) / tokens_per_s
    return {"name": record["name"], "non_embedding": record["non_embedding"], "target_tokens": target,
            "done_tokens": done_tokens, "pflop_days": done_tokens * flops_per_token / PFLOP_DAY,
            "target_pflop_days": target * flops_per_token / PFLOP_DAY, "fraction": done_tokens / target,
            "tokens_per_s": tokens_per_s, "mfu": last("mfu"), "train_loss": last("loss"),
            "eval_loss": evals[max(evals)] if evals else None, "eval_step": max(evals) if evals else None,
            "eta": eta, "state": "done" if finished else f"step {step}/{steps}" if step else "not started"}


def _short(n: float) -> str:
    for suffix, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:.0f}"


def _shown(value, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def table(spec: LadderSpec) -> str:
    rows = [overview(r) for r in size_records(spec)]
    lines = [f"ladder {spec.name} ({spec.out})",
             f"{'run':<16}{'N':>9}{'tokens':>16}{'pflop-days':>11}{'done':>6}{'tok/s':>8}{'MFU':>7}"
             f"{'train':>8}{'eval':>8}{'eta':>8}  state"]
    for r in rows:
        tokens = f"{_short(r['done_tokens'])} / {_short(r['target_tokens'])}"
        lines.append(
            f"{r['name']:<16}{r['non_embedding']:>9,}{tokens:>16}{r['pflop_days']:>11.2e}{100 * r['fraction']:>5.0f}%"
            f"{_shown(r['tokens_per_s'], '{:,.0f}'):>8}{_shown(r['mfu'] and 100 * r['mfu'], '{:.1f}%'):>7}"
            f"{_shown(r['train_loss'], '{:.3f}'):>8}{_shown(r['eval_loss'], '{:.3f}'):>8}"
            f"{duration(r['eta']) if r['eta'] is not None else '-':>8}  {r['state']}")
    done = sum(r["pflop_days"] for r in rows)
    target = sum(r["target_pflop_days"] for r in rows)
    etas = [r["eta"] for r in rows if r["eta"] is not None]
    lines.append(f"total: {done:.2e} of {target:.2e} pflop-days ({100 * done / target:.0f}%), "
                 f"{sum(r['state'] == 'done' for r in rows)}/{len(rows)} runs done"
                 + (f", eta of the sizes under way {duration(sum(etas))}" if etas else ""))
    lines.append("tokens: done / target; train, eval: the latest training and evaluation losses; eta: the tokens left at "
                 "the last tokens/s")
    return "\n".join(lines)
