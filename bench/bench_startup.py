"""Start-up: the time from a fresh process to its first result, ours against HF transformers on the same checkpoint.

    .venv/bin/python bench/bench_startup.py                        # --predict against HF, 3 repeats each
    .venv/bin/python bench/bench_startup.py --jobs predict eval train --repeats 1
    .venv/bin/python bench/bench_startup.py --hf_dir /tmp/default-hf   # an export of your own (written when absent)

Ours is `main.py --model M --predict --prompt P` (the config's max_new_tokens, 96 for the default), run as a user
runs it, in a process of its own; its first sample line ("======== sample ...") is the first result. HF is a
fresh process that imports transformers, loads the `python -m tools.hf to_hf` export of the same checkpoint
(written once into a folder of the temporary directory named after that checkpoint, or into --hf_dir when it
holds no export) with `AutoTokenizer` and `GPTNeoForCausalLM.from_pretrained`,
and generates as many new tokens from the same prompt with the same sampling (temperature, top_k: the config's;
exactly that many tokens, no early stop), then prints its sample. Each side runs --repeats times, alternating.

For each run: the wall time to the first result, the CPU time (user + sys of the process and its children) spent
by then (read from /proc/PID/stat the moment the line arrives: on a machine shared with other work, the CPU time
is the steadier figure), the CPU time of the whole process, and the longest silence before the first result
(the longest gap between two output lines, stdout and stderr, from the start). The headline is ours / HF on the
median wall and CPU time to the first sample (< 1: ours is first). /proc/loadavg is printed before and after:
wall times on a loaded machine are inflated.

`--jobs eval` times `main.py --eval` to its first result line, and `--jobs train` a training run of a copy of the
config in a temporary model_path (train_steps 1: the first step's line), both without an HF side.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# The line that is each job's first result.
FIRST_RESULT = {
    "predict": re.compile(r"^======== sample"),
    "hf": re.compile(r"^======== sample"),
    "eval": re.compile(r"(loss|perplexity|bits per byte)", re.IGNORECASE),
    "train": re.compile(r"^step\s+\d+/"),
}
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """user + sys of process `pid` and of its children it waited for, from /proc/PID/stat (0.0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICKS  # utime, stime, cutime, cstime


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def timed_run(cmd: list, first: re.Pattern, env: dict | None = None) -> dict:
    """Runs `cmd` (stdout and stderr read together, unbuffered) to its end: the wall and CPU seconds at its first
    line matching `first`, the CPU seconds of the whole process, the longest gap between lines before it and
    the lines printed before it (with their times)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    result = {"first_s": None, "first_cpu_s": None, "lines_before": []}
    last, longest, buffer = 0.0, 0.0, b""
    while True:
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            break
        now = time.perf_counter() - start
        buffer += chunk
        *lines, buffer = re.split(rb"[\r\n]", buffer)
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            if not line.strip() or result["first_s"] is not None:
                continue
            longest, last = max(longest, now - last), now
            if first.search(line):
                result.update(first_s=now, first_cpu_s=cpu_seconds(proc.pid))
            else:
                result["lines_before"].append((round(now, 2), line[:120]))
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    result.update(total_s=time.perf_counter() - start, total_cpu_s=usage.ru_utime + usage.ru_stime,
                  longest_silence_s=longest, returncode=proc.returncode)
    if result["first_s"] is not None:
        result["longest_silence_s"] = max(longest, result["first_s"] - last)
    return result


def worker_hf(args) -> int:
    """The HF side, in a fresh process: imports, the export loaded, the same sampling, the sample printed."""
    import torch
    from transformers import AutoTokenizer, GPTNeoForCausalLM

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.hf_dir)
    model = GPTNeoForCausalLM.from_pretrained(args.hf_dir).eval()
    with open(args.prompt, encoding="utf-8") as f:
        prompt = f.read()
    ids = tokenizer(prompt, return_tensors="pt").input_ids[:, -(model.config.max_position_embeddings - args.new_tokens):]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=args.temperature,
                             top_k=args.top_k, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                             pad_token_id=tokenizer.eos_token_id)
    print(f"======== sample 0 (hf) ========\n{prompt}{tokenizer.decode(out[0, ids.shape[1]:])}", flush=True)
    return 0


def export_folder(checkpoint: str) -> str:
    """Where the export of `checkpoint` (a prefix) goes when --hf_dir is not given: a folder of the temporary
    directory named after the checkpoint's path and its index file's time and size, so that a retrained or
    another model's checkpoint is exported again instead of being compared against an older export."""
    index = os.stat(checkpoint + ".index")
    key = f"{os.path.realpath(checkpoint)}:{index.st_mtime_ns}:{index.st_size}"
    return os.path.join(tempfile.gettempdir(), "bench-startup-hf-" + hashlib.sha1(key.encode()).hexdigest()[:12])


def export_hf(args) -> None:
    """The to_hf export of the config's newest checkpoint into args.hf_dir, unless it holds one."""
    if os.path.exists(os.path.join(args.hf_dir, "config.json")):
        return
    print(f"exporting {args.model}'s checkpoint to {args.hf_dir} (python -m tools.hf to_hf) ...", flush=True)
    subprocess.run([sys.executable, "-m", "tools.hf", "to_hf", "--model", args.model, "--out", args.hf_dir],
                   cwd=ROOT, check=True)


def training_config(model: str, folder: str) -> str:
    """A copy of `model`'s config training one step into `folder` (the config's own model_path untouched)."""
    from config import resolve_config_path
    with open(resolve_config_path(model)) as f:
        raw = json.load(f)
    raw.update(model_path=os.path.join(folder, "run"), train_steps=1, steps_per_checkpoint=1)
    path = os.path.join(folder, "config.json")
    with open(path, "w") as f:
        json.dump(raw, f)
    return path


def commands(args, job: str, folder: str) -> list:
    main = [sys.executable, "main.py", "--model", args.model]
    if job == "predict":
        return main + ["--predict", "--prompt", args.prompt, "--predict_output", os.path.join(folder, "samples")]
    if job == "eval":
        return main + ["--eval"]
    if job == "train":
        return [sys.executable, "main.py", "--model", training_config(args.model, folder), "--new", "--yes"]
    return [sys.executable, os.path.abspath(__file__), "--worker", "hf", "--hf_dir", args.hf_dir, "--prompt",
            args.prompt, "--new_tokens", str(args.new_tokens), "--temperature", str(args.temperature),
            "--top_k", str(args.top_k)]


def summary(runs: list) -> dict:
    ok = [r for r in runs if r["first_s"] is not None]
    if not ok:
        return {"runs": len(runs), "failed": runs}
    return {"runs": len(runs), "first_s": statistics.median(r["first_s"] for r in ok),
            "first_cpu_s": statistics.median(r["first_cpu_s"] for r in ok),
            "total_cpu_s": statistics.median(r["total_cpu_s"] for r in ok),
            "longest_silence_s": max(r["longest_silence_s"] for r in ok), "lines_before": ok[-1]["lines_before"]}


def measure(args) -> dict:
    from config import load_config
    cfg = load_config(args.model)
    args.new_tokens = args.new_tokens or cfg.max_new_tokens
    args.temperature = cfg.temperature if args.temperature is None else args.temperature
    args.top_k = cfg.top_k if args.top_k is None else args.top_k
    sides = list(args.jobs) + (["hf"] if "predict" in args.jobs and not args.no_hf else [])
    if "hf" in sides:
        if args.hf_dir is None:
            from modelpath import checkpoints
            checkpoint = checkpoints.restorable(cfg.model_path)
            if checkpoint is None:
                raise SystemExit(f"error: no checkpoint in {cfg.model_path} to compare HF on: train {args.model} "
                                 f"first (bash quickstart.sh trains the default), or pass --no_hf")
            args.hf_dir = export_folder(checkpoint)
        export_hf(args)
    runs = {side: [] for side in sides}
    load_before = loadavg()
    for _ in range(args.repeats):
        for side in sides:
            with tempfile.TemporaryDirectory(prefix="bench-startup-") as folder:
                # USE_TF=0: transformers would import TensorFlow too where it is installed (this venv), which an HF
                # user's would not have
                r = timed_run(commands(args, side, folder), FIRST_RESULT[side], {"USE_TF": "0"} if side == "hf" else None)
            print(f"  {side}: first result {r['first_s'] if r['first_s'] is None else round(r['first_s'], 2)} s "
                  f"wall, {r['first_cpu_s']} s CPU (load {loadavg()})", flush=True)
            runs[side].append(r)
    return {"load_before": load_before, "load_after": loadavg(), "new_tokens": args.new_tokens,
            "sides": {side: summary(r) for side, r in runs.items()}}


def print_table(result: dict) -> None:
    print(f"\ntime to the first result, median of the runs (load average {result['load_before']} before, "
          f"{result['load_after']} after); {result['new_tokens']} new tokens")
    print(f"{'side':10} {'wall s':>8} {'CPU s':>8} {'CPU s (whole run)':>18} {'longest silence s':>18}")
    sides = result["sides"]
    for side, s in sides.items():
        if "first_s" not in s:
            print(f"{side:10} failed: {s['failed'][0].get('returncode')}")
            continue
        print(f"{side:10} {s['first_s']:8.2f} {s['first_cpu_s']:8.2f} {s['total_cpu_s']:18.2f} "
              f"{s['longest_silence_s']:18.2f}")
    for side, s in sides.items():
        if s.get("lines_before"):
            print(f"{side}'s lines before its first result:")
            for t, line in s["lines_before"]:
                print(f"  {t:7.2f} s  {line}")
    ours, hf = sides.get("predict", {}), sides.get("hf", {})
    if "first_s" in ours and "first_s" in hf:
        print(f"ours / HF, time to the first sample: wall {ours['first_s'] / hf['first_s']:.2f}x, "
              f"CPU {ours['first_cpu_s'] / hf['first_cpu_s']:.2f}x (< 1: ours first)")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--prompt", default="data/prompts/default.txt")
    p.add_argument("--hf_dir", help="the to_hf export HF loads (written there when absent; default: a folder of "
                   "the temporary directory named after the config's newest checkpoint)")
    p.add_argument("--jobs", nargs="+", default=["predict"], choices=["predict", "eval", "train"])
    p.add_argument("--no_hf", action="store_true", help="ours only")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new_tokens", type=int, default=None, help="default: the config's max_new_tokens")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top_k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--worker", choices=["hf"], help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if args.worker:
        return worker_hf(args)
    result = measure(args)
    print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
