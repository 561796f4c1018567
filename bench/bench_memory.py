"""Memory and context: peak resident memory and training speed against the context, this project against HF's
GPTNeo, at GPT-Neo 125M's shape, batch 1; and the longest context each side trains within the machine's RAM.

    .venv/bin/python bench/bench_memory.py                          # contexts 512 ... 8192, then each side's limit
    .venv/bin/python bench/bench_memory.py --memory_gib 8 --no_limit   # a shared machine: stop each run at 8 GiB
    .venv/bin/python bench/bench_memory.py --contexts 512 1024 --peers bfloat16+compile --plot /tmp/mem.png

For each context (--contexts) each side trains --warmup + --steps steps in its own fresh process (bench_train.py's
workers: ours in the precision `precision: auto` picks here, HF's peers as bench_train.py's --peers, by default
eager and torch.compile in that precision). The bench watches each worker's resident memory, its child processes'
included (torch.compile's compile workers), every 0.1 s, and stops it where it passes the budget (--memory_gib,
default: the machine's RAM): that side does not train that context within the budget, and is not run at longer
ones. Each finished run reports its process's peak RSS (the kernel's high-water mark) and tokens/s.

Then (unless --no_limit) each side's context is doubled from the longest that trained until a run passes the
budget (or --max_ctx): the longest context each trains within the budget, and ours / the best peer's. A plot
(--plot, a PNG) shows peak RSS and tokens/s against the context for every side, with the budget.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
if __name__ == "__main__":
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()

import bench_train  # noqa: E402

MARK = bench_train.MARK


def machine_ram() -> int:
    """MemTotal, bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("error: /proc/meminfo has no MemTotal: this bench reads Linux's /proc")


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and all its descendants (from /proc: each process's parent and statm)."""
    children, page = {}, os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * page
        except OSError:
            pass
    return total


def run_watched(command: list, budget: int, interval: float = 0.1) -> tuple[dict | None, int, str]:
    """Runs `command` (a bench_train worker) in its own process group, stopping the group where the tree's RSS
    passes `budget`. Returns (its result or None, the highest tree RSS seen, "ok" / "over budget" / "failed:
    <its last words>")."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True, cwd=ROOT, start_new_session=True)
        highest, over = 0, False
        while process.poll() is None:
            rss = tree_rss(process.pid)
            highest = max(highest, rss)
            if rss > budget:
                over = True
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                break
            time.sleep(interval)
        try:
            os.killpg(process.pid, signal.SIGKILL)  # compile workers left behind
        except ProcessLookupError:
            pass
        out.seek(0)
        err.seek(0)
        lines = [l for l in out.read().splitlines() if l.startswith(MARK)]
        if over:
            return None, highest, "over budget"
        if process.returncode != 0 or not lines:
            # the kernel's OOM killer (SIGKILL) before our watch saw it: over the machine's memory
            status = "over budget" if process.returncode == -signal.SIGKILL else \
                "failed: " + " | ".join(err.read().strip().splitlines()[-3:])
            return None, highest, status
        return json.loads(lines[-1][len(MARK):]), highest, "ok"


def worker_command(side: str, variant: str, n_ctx: int, args) -> list:
    precision, _, extra = variant.partition("+")
    shape = bench_train.SHAPES["125m"]
    command = [sys.executable, os.path.join(HERE, "bench_train.py"), "--worker", "ours" if side == "ours" else "hf",
               "--precision", precision, "--shape", "125m", "--n_ctx", str(n_ctx), "--warmup", str(args.warmup),
               "--steps", str(args.steps), "--peak_seconds", "0", "--peak_size", "64"]
    for key in ("n_layer", "n_embd", "n_head", "n_vocab", "window", "batch"):
        command += [f"--{key}", str(getattr(args, key) or shape[key])]
    if args.cpus:
        command += ["--cpus", args.cpus]
    return command + (["--" + extra] if extra else [])


def measure(args) -> dict:
    from devices import precision
    cpu_name, flags = precision.cpu_info()
    auto = precision.choose("auto", "CPU", flags).precision
    peers = args.peers or [auto, auto + "+compile"]
    sides = [("ours", auto, f"ours {auto} (auto)")] + [("hf", p, bench_train.peer_name(p)) for p in peers]
    budget = int(args.memory_gib * 2 ** 30) if args.memory_gib else machine_ram()
    print(f"# {precision.cpu_kind(cpu_name, flags)}; budget {budget / 2 ** 30:.1f} GiB "
          f"({'--memory_gib' if args.memory_gib else 'the machine RAM'}); load average {bench_train.load()} at start",
          flush=True)
    load_start = bench_train.load()
    runs = {name: {} for _, _, name in sides}
    stopped = set()

    def run(side, variant, name, n_ctx):
        started = time.time()
        result, highest, status = run_watched(worker_command(side, variant, n_ctx, args), budget)
        row = dict(side=name, n_ctx=n_ctx, status=status, tree_rss_max=highest, wall_s=round(time.time() - started, 1),
                   load=bench_train.load())
        if result:
            row.update(tokens_per_s=result["tokens_per_s"], peak_rss=result["peak_rss"],
                       rss_framework=result.get("rss_framework"))
        print(json.dumps(row), flush=True)
        runs[name][n_ctx] = row
        return status == "ok"

    for n_ctx in args.contexts:
        for side, variant, name in sides:
            if name not in stopped and not run(side, variant, name, n_ctx):
                stopped.add(name)
    limits = {}
    for side, variant, name in sides:
        trained = [c for c, r in runs[name].items() if r["status"] == "ok"]
        n_ctx = max(trained) if trained else None
        if not args.no_limit and name not in stopped and n_ctx:
            while n_ctx * 2 <= args.max_ctx and run(side, variant, name, n_ctx * 2):
                n_ctx *= 2
        # bounded: a run passed the budget, so this is the longest; else it is at least this
        limits[name] = dict(longest=n_ctx, bounded=any(r["status"] != "ok" for r in runs[name].values()))
    best_peer = longest_peer(limits, [n for _, _, n in sides[1:]])
    return dict(cpu=precision.cpu_kind(cpu_name, flags), auto=auto, budget=budget, sides=[n for _, _, n in sides],
                runs={n: [runs[n][c] for c in sorted(runs[n])] for n in runs}, limits=limits, best_peer=best_peer,
                load_start=load_start, load_end=bench_train.load(), warmup=args.warmup, steps=args.steps)


def longest_peer(limits: dict, peers: list):
    """The peer that trains the longest context within the budget (None without peers)."""
    return max(peers, key=lambda n: limits[n]["longest"] or 0, default=None)


def print_table(s: dict) -> None:
    contexts = sorted({r["n_ctx"] for rows in s["runs"].values() for r in rows})
    print(f"\n125M shape, batch 1, {s['warmup']} warm-up + {s['steps']} timed steps; budget "
          f"{s['budget'] / 2 ** 30:.1f} GiB; peak RSS GiB / tokens/s")
    print(f"{'':<28}" + "".join(f"{'ctx ' + str(c):>18}" for c in contexts) + f"{'longest':>10}")
    for name in s["sides"]:
        by = {r["n_ctx"]: r for r in s["runs"][name]}
        cells = []
        for c in contexts:
            r = by.get(c)
            cells.append("" if r is None else f"{r['peak_rss'] / 2 ** 30:.2f} / {r['tokens_per_s']:,.0f}"
                         if r["status"] == "ok" else r["status"][:16])
        limit = s["limits"][name]
        print(f"{name:<28}" + "".join(f"{c:>18}" for c in cells) +
              f"{(str(limit['longest']) if limit['longest'] else '-') + ('' if limit['bounded'] else '+'):>10}")
    ours, peer = s["limits"][s["sides"][0]]["longest"], s["best_peer"] and s["limits"][s["best_peer"]]["longest"]
    if ours and peer and s["limits"][s["best_peer"]]["bounded"]:  # else the peer's limit is not known
        print(f"longest context within the budget, ours / best peer ({s['best_peer']}): {ours} / {peer} = "
              f"{ours / peer:.1f}x{'' if s['limits'][s['sides'][0]]['bounded'] else ' (ours not bounded: at least)'}")
    print(f"# load average {s['load_end']} at end")


def plot(s: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem, speed) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in s["sides"]:
        ok = [r for r in s["runs"][name] if r["status"] == "ok"]
        contexts = [r["n_ctx"] for r in ok]
        line, = mem.plot(contexts, [r["peak_rss"] / 2 ** 30 for r in ok], marker="o", label=name)
        speed.plot(contexts, [r["tokens_per_s"] for r in ok], marker="o", label=name, color=line.get_color())
        over = [r["n_ctx"] for r in s["runs"][name] if r["status"] != "ok"]
        if over:
            mem.scatter(over, [s["budget"] / 2 ** 30] * len(over), marker="x", color=line.get_color(), zorder=3)
    mem.axhline(s["budget"] / 2 ** 30, color="gray", linestyle="--", label="budget (x: over it)")
    for ax, label in ((mem, "peak RSS (GiB)"), (speed, "tokens/s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    mem.legend(fontsize=8)
    fig.suptitle(f"Training at GPT-Neo 125M's shape, batch 1: {s['cpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    p.add_argument("--peers", nargs="+", choices=bench_train.PEERS,
                   help="HF's set-ups (default: eager and +compile in the precision auto picks here)")
    p.add_argument("--memory_gib", type=float, help="stop a run whose memory passes this (default: the machine's "
                   "RAM; set less on a shared machine)")
    p.add_argument("--no_limit", action="store_true", help="only --contexts: do not look for each side's longest")
    p.add_argument("--max_ctx", type=int, default=65536, help="the longest context the limit search tries")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--plot", default="memory_context.png", help="where to write the plot (PNG)")
    p.add_argument("--cpus", default="", help="run on these CPUs only, e.g. 0")
    for key in ("n_layer", "n_embd", "n_head", "n_vocab", "window", "batch"):
        p.add_argument(f"--{key}", type=int, help=f"override the 125M shape's {key} (a smaller model for a check)")
    args = p.parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        raise SystemExit("error: --warmup and --steps must be at least 1")
    args.contexts = sorted(set(args.contexts))
    return args


def main(argv=None) -> int:
    args = parse(argv)
    summary = measure(args)
    print_table(summary)
    if args.plot:
        plot(summary, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
