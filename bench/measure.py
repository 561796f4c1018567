"""The measurements docs/measured.md shows, in one run: training speed at the bench, neo and 125m shapes against
HF's peers, memory and speed against the context at 125M, decoding, lm-evaluation-harness against its hf backend
and the time to a first sample against transformers; printed as the doc's tables (Markdown) with issue #43's
targets, headed by the date, the CPU kind, the commit and the load.

    .venv/bin/python bench/measure.py                         # everything (about 75 minutes on a 2-core CPU)
    .venv/bin/python bench/measure.py --only train --shapes bench neo
    .venv/bin/python bench/measure.py --memory_gib 8          # a shared machine: each memory run stops at 8 GiB
    .venv/bin/python bench/measure.py --quick --out /tmp/measured.md   # a quick check of the whole pipeline

It runs bench_train.py (--repeats, each set-up's best of the interleaved repeats), bench_memory.py (contexts 512 ...
8192, then each side's longest context within the budget; the plot goes to --plot), bench_decode.py (median
of --decode_repeats), bench_harness.py and bench_startup.py (the default model's checkpoint, which `bash
quickstart.sh` trains; without one that table says so), each printing its own JSON lines and table as it goes, then the Markdown tables together
(also written to --out where given). Measure on a quiet machine: `uptime`'s load before and after is in the
header; the peers' OpenMP kernels (inductor's, oneDNN's bf16) slow down far more than TF's when other work
shares the cores.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
if __name__ == "__main__":
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()

import bench_decode  # noqa: E402
import bench_harness  # noqa: E402
import bench_memory  # noqa: E402
import bench_startup  # noqa: E402
import bench_train  # noqa: E402

# The targets, by table: what ours / the best peer must reach (issue #43; the memory target is #34's).
TRAIN_TARGETS = {"bench": 1.3, "neo": 3.0, "125m": 2.5}
BENCH_BF16_MFU = 0.60  # of the bf16 matmul peak, on CPUs with AMX
MEMORY_TARGET = 2.0
DECODE_TARGET = 1.5
HARNESS_GENERATE_TARGET = 1.5  # generate_until's examples/s against lm-eval's hf backend
HARNESS_HELD_TARGET = 2.0      # the variables the harness's programs hold, in copies of the weights
STARTUP_TARGET = 1.0           # ours / HF, wall time to the first sample: at most HF's
STARTUP_SILENCE_S = 3.0        # the longest wait without a line before the first sample


def commit() -> str:
    def git(*a):
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    sha = git("rev-parse", "--short", "HEAD") or "unknown"
    return sha + (" (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def versions() -> str:
    out = []
    for name in ("tensorflow", "torch", "transformers"):
        try:
            from importlib.metadata import version
            out.append(f"{name} {version(name)}")
        except Exception:  # noqa: BLE001  (a package missing is said, not fatal)
            out.append(f"{name} missing")
    return ", ".join(out)


def header(cpu: str, loads: list, sha: str) -> str:
    return (f"**{datetime.date.today().isoformat()}**, {cpu}, {os.cpu_count()} CPUs, {platform.machine()}; commit "
            f"{sha}; {versions()}; load average (1 min) {loads[0]:.2f} at start, {loads[-1]:.2f} at end.")


def met(value, target) -> str:
    return "-" if value is None else f"{'met' if value >= target else 'not met'} (≥ {target:g}x)"


def train_table(summaries: list) -> str:
    """One row per shape: tokens/s of every set-up (MFU against the peak of its precision, peak RSS), ours / the
    best peer, the target."""
    names = []
    for s in summaries:
        names += [r["name"] for r in s["rows"] if r["name"] not in names]
    lines = ["| shape | " + " | ".join(names) + " | ours / best peer | target |",
             "|---" * (len(names) + 3) + "|"]
    for s in summaries:
        m = s["model"]
        by = {r["name"]: r for r in s["rows"]}
        cells = [f"{by[n]['tokens_per_s']:,.0f} ({100 * by[n]['mfu']:.0f}% {'bf16' if by[n]['precision'] == 'bfloat16' else 'fp32'}"
                 f" MFU, {by[n]['peak_rss'] / 2 ** 30:.1f} GiB)" if n in by else "" for n in names]
        target = met(s["ratio"], TRAIN_TARGETS.get(s["shape"], 1.0))
        auto = next((r for r in s["rows"] if r["side"] == "ours" and r["variant"] == s["auto"]), None)
        if s["shape"] == "bench" and auto and auto["precision"] == "bfloat16":
            where = "" if "amx" in s["cpu"].lower() else ", a target on AMX CPUs"
            target += (f"; bf16 MFU {'met' if auto['mfu'] >= BENCH_BF16_MFU else 'not met'} (≥ {BENCH_BF16_MFU:.0%}"
                       f"{where})")
        ratio = f"**{s['ratio']:.2f}x** ({s['best_peer']})" if s["ratio"] else "-"
        lines.append(f"| {s['shape']} ({m['n_layer']}x{m['n_embd']}, ctx {m['n_ctx']}, window {m['window']}, batch "
                     f"{m['batch']}) | " + " | ".join(cells) + f" | {ratio} | {target} |")
    peaks = "; ".join(f"{s['shape']}: TF fp32 {s['peak']['float32'] / 1e9:.0f}, bf16 {s['peak']['bfloat16'] / 1e9:.0f}"
                      + (f", PyTorch fp32 {s['torch_peak']['float32'] / 1e9:.0f}, bf16 "
                         f"{s['torch_peak']['bfloat16'] / 1e9:.0f}" if s.get("torch_peak") else "")
                      for s in summaries)
    return "\n".join(lines) + f"\n\nMatmul peaks measured in the same runs (GFLOP/s, 1024² products): {peaks}.\n"


def memory_table(s: dict, plot: str | None) -> str:
    contexts = sorted({r["n_ctx"] for rows in s["runs"].values() for r in rows})
    lines = ["| | " + " | ".join(f"ctx {c}" for c in contexts) + " | longest within the budget |",
             "|---" * (len(contexts) + 2) + "|"]
    for name in s["sides"]:
        by = {r["n_ctx"]: r for r in s["runs"][name]}
        cells = [("" if c not in by else f"{by[c]['peak_rss'] / 2 ** 30:.2f} GiB, {by[c]['tokens_per_s']:,.0f} tok/s"
                  if by[c]["status"] == "ok" else by[c]["status"]) for c in contexts]
        limit = s["limits"][name]
        longest = f"{limit['longest'] or '-'}" + ("" if limit["bounded"] else " or more")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {longest} |")
    ours, peer = s["limits"][s["sides"][0]], s["best_peer"] and s["limits"][s["best_peer"]]
    text = "\n".join(lines) + f"\n\nBudget {s['budget'] / 2 ** 30:.1f} GiB. "
    if ours["longest"] and peer and peer["longest"] and peer["bounded"]:
        ratio = ours["longest"] / peer["longest"]
        at_least = "" if ours["bounded"] else "at least "
        text += (f"Longest context, ours / best peer ({s['best_peer']}): {at_least}**{ratio:.1f}x**, target "
                 f"{met(ratio, MEMORY_TARGET)}.\n")
    else:  # the peer trained every context tried: the ratio is not known
        text += "Longest context, ours / best peer: not determined (the peer reached no limit within the runs).\n"
    return text + (f"\n![peak RSS and tokens/s against the context]({os.path.basename(plot)})\n" if plot else "")


def decode_table(s: dict) -> str:
    prompts = s["prompt_lengths"]
    lines = ["| ms per token | " + " | ".join(f"prompt {p}" for p in prompts) + " |", "|---" * (len(prompts) + 1) + "|"]
    for r in s["runs"]:
        lines.append(f"| {r['measure']} | " + " | ".join(f"{bench_decode.ms(r, p):.2f}" if bench_decode.ms(r, p)
                                                      else "too noisy" for p in prompts) + " |")
    ours, ratios = s["runs"][0], []
    for p in prompts:
        peer = bench_decode.best_peer(s, p)
        ratios.append(bench_decode.ms(peer, p) / bench_decode.ms(ours, p) if peer and bench_decode.ms(ours, p) else None)
    lines.append("| **ours / best peer** | " + " | ".join(f"**{x:.2f}x**" if x else "-" for x in ratios) + " |")
    worst = min((x for x in ratios if x), default=None)
    return "\n".join(lines) + f"\n\nTarget ≥ {DECODE_TARGET:g}x at every prompt: {met(worst, DECODE_TARGET)}.\n"


def harness_table(s: dict) -> str:
    sides = list(s["sides"])
    lines = ["| task | examples | " + " | ".join(f"{side}, examples/s: whole (model)" for side in sides)
             + " | ours / hf: whole (model) |", "|---" * (len(sides) + 3) + "|"]
    for task in bench_harness.TASKS:
        examples = s["sides"][sides[0]]["tasks"][task]["examples"]
        ratio, model_ratio = s["ratios"].get(task), s["model_ratios"].get(task)
        lines.append(f"| {task} | {examples} | " + " | ".join(f"{s['rates'][task][side]:.1f} "
                                                             f"({s['model_rates'][task][side]:.1f})" for side in sides)
                     + (f" | **{ratio:.2f}x** ({model_ratio:.2f}x) |" if ratio else " | - |"))
    memory = s["sides"]["ours"]["memory"]
    held = memory["held"] / memory["weights"]
    mb = 2 ** 20
    return ("\n".join(lines) + "\n\nWhole: simple_evaluate's call; model: the model's request methods alone. "
            f"Generation (generate_until) ≥ {HARNESS_GENERATE_TARGET:g}x the hf backend, whole: "
            f"{met(s['ratios'].get('tiny_generate'), HARNESS_GENERATE_TARGET)}. Ours held {memory['held'] / mb:.0f} "
            f"MiB of variables for its {memory['programs']} programs, {held:.2f}x the {memory['weights'] / mb:.0f} "
            f"MiB of float32 weights (target ≤ {HARNESS_HELD_TARGET:g}x: "
            f"{'met' if held <= HARNESS_HELD_TARGET else 'not met'}); peak RSS ours "
            f"{memory['peak_rss'] / mb:.0f} MiB" + (f", hf {s['sides']['hf']['memory']['peak_rss'] / mb:.0f} MiB"
                                                    if "hf" in s["sides"] else "") + ".\n")


def startup_table(s: dict) -> str:
    lines = ["| side | wall s to the first sample | CPU s by then | CPU s, whole run | longest silence before it, s |",
             "|---|---|---|---|---|"]
    for side, r in s["sides"].items():
        name = "ours (`main.py --predict`)" if side == "predict" else "HF (transformers, the to_hf export)"
        lines.append(f"| {name} | " + (f"{r['first_s']:.2f} | {r['first_cpu_s']:.2f} | {r['total_cpu_s']:.2f} | "
                                       f"{r['longest_silence_s']:.2f} |" if "first_s" in r else "failed | | | |"))
    ours, hf = s["sides"].get("predict", {}), s["sides"].get("hf", {})
    if "first_s" not in ours or "first_s" not in hf:
        return "\n".join(lines) + "\n"
    ratio = ours["first_s"] / hf["first_s"]
    silent = ours["longest_silence_s"]
    return ("\n".join(lines) + f"\n\nOurs / HF, wall time to the first sample: **{ratio:.2f}x** (CPU "
            f"{ours['first_cpu_s'] / hf['first_cpu_s']:.2f}x); target ≤ {STARTUP_TARGET:g}x: "
            f"{'met' if ratio <= STARTUP_TARGET else 'not met'}. Longest silence before it {silent:.1f} s (target "
            f"≤ {STARTUP_SILENCE_S:g} s: {'met' if silent <= STARTUP_SILENCE_S else 'not met'}).\n")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parts = ["train", "memory", "decode", "harness", "startup"]
    p.add_argument("--only", nargs="+", choices=parts, default=parts)
    p.add_argument("--shapes", nargs="+", choices=sorted(bench_train.SHAPES), default=["bench", "neo", "125m"])
    p.add_argument("--repeats", type=int, default=2, help="bench_train's interleaved repeats (the best counts)")
    p.add_argument("--decode_repeats", type=int, default=5)
    p.add_argument("--startup_repeats", type=int, default=3)
    p.add_argument("--startup_model", default="default", help="the trained config whose first sample is timed "
                   "(`bash quickstart.sh` trains `default`)")
    p.add_argument("--memory_gib", type=float, help="bench_memory's budget (default: the machine's RAM)")
    p.add_argument("--plot", default=os.path.join(ROOT, "docs", "memory_context.png"))
    p.add_argument("--out", help="also write the Markdown here")
    p.add_argument("--cpus", default="", help="run every measurement on these CPUs only, e.g. 0")
    p.add_argument("--quick", action="store_true", help="few steps and repeats, contexts 512 and 1024 only: checks "
                   "that everything runs, figures not to quote")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    from devices import precision
    # the commit measured, read before the run: the memory plot it writes into docs/ is not a change to the code
    loads, parts, sha = [bench_train.load()[0]], [], commit()
    cpu = precision.cpu_kind(*precision.cpu_info())  # the header names it, whichever tables run
    quick_train = ["--warmup", "1", "--steps", "2", "--peak_seconds", "1"] if args.quick else []
    if "train" in args.only:
        summaries = []
        for shape in args.shapes:
            s = bench_train.measure(bench_train.parse(["--shape", shape, "--repeats", "1" if args.quick else
                                                       str(args.repeats), "--cpus", args.cpus] + quick_train))
            bench_train.print_table(s, bench_train.parse([]))
            summaries.append(s)
        parts.append("### Training, tokens/s (`bench_train.py --shape S --repeats "
                     f"{1 if args.quick else args.repeats}`)\n\n" + train_table(summaries))
    if "memory" in args.only:
        margv = ["--plot", args.plot, "--cpus", args.cpus] + (["--memory_gib", str(args.memory_gib)]
                                                              if args.memory_gib else [])
        if args.quick:
            margv += ["--contexts", "512", "1024", "--no_limit", "--steps", "1"]
        s = bench_memory.measure(bench_memory.parse(margv))
        bench_memory.print_table(s)
        if args.plot:
            bench_memory.plot(s, args.plot)
        parts.append("### Memory and context, 125M shape, batch 1 (`bench_memory.py`): peak RSS and tokens/s\n\n" +
                     memory_table(s, args.plot))
    if "decode" in args.only:
        dargv = ["--repeats", "2" if args.quick else str(args.decode_repeats), "--cpus", args.cpus]
        dargs = bench_decode.parse(dargv)
        s = bench_decode.measure(dargs)
        bench_decode.print_table(s, dargs)
        parts.append(f"### Decoding, batch 1, greedy, context {dargs.n_ctx} (`bench_decode.py --repeats "
                     f"{dargs.repeats}`: median ms per new token)\n\n" + decode_table(s))
    if "harness" in args.only:
        s = bench_harness.measure(bench_harness.parse(["--examples", "40" if args.quick else "200"]))
        bench_harness.print_table(s)
        parts.append("### lm-evaluation-harness against its hf backend (`bench_harness.py`: 4 x 256, context 256, "
                     "batch 16, fp32 on both sides)\n\n" + harness_table(s))
    if "startup" in args.only:
        sargs = bench_startup.parse(["--model", args.startup_model, "--repeats", "1" if args.quick
                                     else str(args.startup_repeats)])
        from config import load_config
        from modelpath import checkpoints
        model_path = load_config(args.startup_model).model_path
        if checkpoints.latest(model_path) is None:  # say so and keep the other tables
            print(f"start-up not measured: no checkpoint in {model_path} (`bash quickstart.sh` trains one)")
            parts.append(f"### Start-up\n\nNot measured: no checkpoint in {model_path}.\n")
        else:
            s = bench_startup.measure(sargs)
            bench_startup.print_table(s)
            parts.append(f"### Start-up: a fresh `main.py --model {args.startup_model} --predict` against transformers "
                         f"on its to_hf export (`bench_startup.py`, {s['new_tokens']} new tokens, median of "
                         f"{sargs.repeats})\n\n" + startup_table(s))
    loads.append(bench_train.load()[0])
    quick = "\n\n*--quick: a check of the pipeline, not figures to quote.*" if args.quick else ""
    text = header(cpu, loads, sha) + quick + "\n\n" + "\n".join(parts)
    print("\n" + text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
