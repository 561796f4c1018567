"""Training speed: this project against HF transformers' GPTNeoForCausalLM (PyTorch, CPU), same model, same machine.

    .venv/bin/python bench/bench_train.py                     # ours fp32 and bf16 (where the CPU has bf16 units), HF's peers
    .venv/bin/python bench/bench_train.py --shape neo         # GPT-Neo's context 2048, window 256, batch 1 (bench's width)
    .venv/bin/python bench/bench_train.py --shape 125m        # GPT-Neo 125M itself: 12 x 768, vocab 50257, context 2048
    .venv/bin/python bench/bench_train.py --shape neo --warmup 1 --steps 2 --peak_seconds 1   # a quick check
    .venv/bin/python bench/bench_train.py --peers float32 bfloat16+compile    # some of HF's set-ups only
    .venv/bin/python bench/bench_train.py --cpus 0            # the same on one pinned core (a shared machine)
    .venv/bin/python bench/bench_train.py --variants float32 float32+xla --repeats 2 --steps 8
    .venv/bin/python bench/bench_train.py --auto_jit --skip_hf --variants float32 --repeats 3   # XLA auto-clustering
    .venv/bin/python bench/bench_train.py --skip_hf --peer_python OLD/.venv/bin/python --peer_repo OLD   # vs another stack

Trains the same GPT-Neo model (--shape bench, the default: 6 layers, 512 wide, 8 heads, context 256, vocabulary
8192, batch 8, global/local attention alternating with a 128-token window; --shape neo: the same width at
GPT-Neo's context 2048, window 256 and batch 1, where this project's local layers compute over their window only
and HF's over the whole masked square; --shape 125m: GPT-Neo 125M's own config, 12 layers, 768 wide, 12 heads,
vocabulary 50257, context 2048, window 256, batch 1; Adam, gradient clipping 1.0) for --warmup steps that are
not timed, then --steps timed steps, in this project (the real training path: train/loop.py's train on a
one-device placement mesh, saving a checkpoint at the end) and in HF's GPTNeo with torch.optim.AdamW (fused).

HF runs as a PyTorch user on this CPU would pick (--peers): eager, and under torch.compile (the forward pass and
the loss compiled as one function, inductor's default mode), each in float32 and, where the CPU has bf16 matrix
units, bf16 autocast. The headline is ours (in the precision `precision: auto` picks here) / the best of the
peers measured. Every measurement runs in its own fresh process, one after another, so the two frameworks never
share the cores or each other's thread pools; with --repeats N each is measured N times, interleaved, and the
best is kept (the machine is shared: the best run is the one least disturbed).

Reports the CPU (its vector and bf16 matrix units), tokens/s of every set-up and its ratio to the best peer,
model FLOP/s (models/flops.py: 6 x parameters + attention over the keys each query really sees, per token), MFU
against TensorFlow's measured matmul peak in the precision that ran (fp32 or bf16: a bf16 step is held to the
bf16 peak), the peak resident memory (RSS) of each side's process, and the fp32 and bf16 matmul peaks of both
frameworks (TF's and PyTorch's), measured in the same run. One JSON object per measurement on stdout, then a
table; `measure` returns the same as a dict (bench/measure.py prints the docs' tables from it).

--auto_jit measures each of ours also under TensorFlow's XLA auto-clustering of the whole step (bench/worker.py's
JIT_MODES: auto_jit, and auto_jit+onednn with XLA:CPU's oneDNN matmuls), interleaved with the default in every
repeat, and prints each mode's median tokens/s over the repeats, its ratio to the default's, and the seconds to
the first step's end (graph, session, XLA's compiles) and of the other warm-up steps.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":  # the benchmark and its worker processes: TF's C++ chatter off the console
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()

import worker  # noqa: E402

MARK = worker.MARK
# Shapes: every flag of model_args; a flag given on the command line overrides its shape's value.
SHAPES = {
    "bench": dict(n_layer=6, n_embd=512, n_head=8, n_vocab=8192, n_ctx=256, window=128, batch=8),
    "neo": dict(n_layer=6, n_embd=512, n_head=8, n_vocab=8192, n_ctx=2048, window=256, batch=1),
    "125m": dict(n_layer=12, n_embd=768, n_head=12, n_vocab=50257, n_ctx=2048, window=256, batch=1),  # GPT-Neo 125M
}
VARIANTS = ["float32", "float32+xla", "bfloat16", "bfloat16+xla"]
# HF's set-ups: precision (bfloat16 = autocast), +compile for torch.compile
PEERS = ["float32", "bfloat16", "float32+compile", "bfloat16+compile"]


def model_args(args) -> dict:
    return dict(n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head, n_ctx=args.n_ctx, n_vocab=args.n_vocab,
                batch=args.batch, window=args.window)


def bench_config(m: dict, precision: str = "float32", model_path: str | None = None, train_steps: int = 10):
    from config import config_from_dict
    return config_from_dict(dict(
        n_layer=m["n_layer"], n_embd=m["n_embd"], n_head=m["n_head"], n_ctx=m["n_ctx"], n_vocab=m["n_vocab"],
        attention_types=[[["global", "local"], m["n_layer"] // 2]] if m["n_layer"] % 2 == 0 else
        [[["global"], m["n_layer"]]], local_attention_radius=m["window"], train_batch_size=m["batch"],
        train_steps=train_steps, steps_per_checkpoint=10 ** 9, lr=1e-4, warmup_steps=0, weight_decay=0.01,
        gradient_clipping=1.0, precision=precision, mesh_shape="all:1", layout="", model_path=model_path),
        "bench config")


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def peak_rss() -> int:
    """This process's peak resident memory so far, bytes (Linux reports kilobytes)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss() -> int:
    """This process's resident memory now, bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


# ---------------------------------------------------------------------------------------------------------
# Workers: each runs in its own process and prints one MARK line.


def best_matmul_rate(run, size: int, seconds: float) -> float:
    """FLOP/s of `run` (one size x size matmul), best of 0.25 s windows over `seconds` (a neighbour's burst only
    lowers a window)."""
    run()
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        runs, start = 0, time.perf_counter()
        while time.perf_counter() - start < 0.25:
            run()
            runs += 1
        best = max(best, 2 * size ** 3 * runs / (time.perf_counter() - start))
    return best


def matmul_peak(dtype_name: str, size: int, seconds: float) -> float:
    """The best square-matmul FLOP/s TensorFlow reaches here, over both of its CPU matmul paths: a tf.function
    (Eigen for fp32) and a v1 graph session (oneDNN's kernels where they are on, as the entry points set them on
    x86-64: console.runtime_defaults; the model's matmuls run this way), each timed for half of
    `seconds`. The highest is the denominator: MFU is never flattered."""
    import numpy as np
    import tensorflow as tf

    dtype = getattr(tf, dtype_name)

    def best_rate(run) -> float:
        return best_matmul_rate(run, size, seconds / 2)

    a = tf.cast(tf.random.normal([size, size]), dtype)
    b = tf.cast(tf.random.normal([size, size]), dtype)
    matmul = tf.function(lambda x, y: tf.matmul(x, y))
    eager = best_rate(lambda: matmul(a, b).numpy())
    graph = tf.Graph()
    with graph.as_default():
        x = tf.Variable(tf.cast(np.random.randn(size, size).astype(np.float32), dtype))
        y = tf.Variable(tf.cast(np.random.randn(size, size).astype(np.float32), dtype))
        product = tf.matmul(x, y)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session_rate = best_rate(lambda: session.run(product.op))
    return max(eager, session_rate)


def worker_peak(args) -> dict:
    import models  # noqa: F401
    return {"fp32_matmul_flops": matmul_peak("float32", args.peak_size, args.peak_seconds),
            "bf16_matmul_flops": matmul_peak("bfloat16", args.peak_size, args.peak_seconds)}


def worker_ours(args, names: list | None = None) -> dict:
    """This project's training speed on `names` (mesh devices; default one CPU device: bench_gpu.py passes a GPU)."""
    import numpy as np
    import models  # noqa: F401
    if args.xla:
        from execution.xla import enable_xla_fusion
        enable_xla_fusion()
    import tensorflow.compat.v1 as tf
    from devices.placement import Placement, configure
    from execution.callbacks import EachStep
    from train import loop
    from models.flops import training_flops_per_token

    tf.get_logger().setLevel("ERROR")
    m = model_args(args)
    names = names or configure(["device:CPU:0"])
    rss_framework = current_rss()
    total = args.warmup + args.steps
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        cfg = bench_config(m, args.precision, os.path.join(folder, "run"), train_steps=total)
        data = np.random.RandomState(0).randint(0, cfg.n_vocab, size=[64, cfg.n_ctx + 1]).astype(np.int32)

        def batches(start_step):
            ds = tf.data.Dataset.from_tensor_slices((data[:, :-1], data[:, 1:]))
            return ds.repeat().batch(cfg.train_batch_size, drop_remainder=True).skip(start_step).prefetch(2)

        times, cpu_times, losses = [], [], []

        def clock(step, values):
            times.append(time.perf_counter())
            cpu_times.append(time.process_time())
            losses.append(float(values["loss"]))

        loop.train(cfg, Placement(tuple(names), kernels=getattr(args, "kernels", "xla")), batches, [EachStep(clock)])
    seconds = times[-1] - times[args.warmup - 1]
    tokens = args.steps * cfg.train_batch_size * cfg.n_ctx
    return {"tokens_per_s": tokens / seconds, "step_s": seconds / args.steps,
            "flops_per_token": training_flops_per_token(cfg), "first_loss": losses[0], "last_loss": losses[-1],
            "peak_rss": peak_rss(), "rss_framework": rss_framework,
            "step_times": [round(b - a, 3) for a, b in zip(times[args.warmup - 1:], times[args.warmup:])],
            # the process's CPU seconds per step (all its threads): on a shared machine, what other work does not
            # stretch as it stretches the wall time (two commits compared on one pinned core: --cpus 0)
            "cpu_s_per_step": (cpu_times[-1] - cpu_times[args.warmup - 1]) / args.steps,
            # the graph's build, the session and the first step (XLA's compiles), then the other warm-up steps
            "to_first_step_s": round(times[0] - started, 2),
            "warmup_step_times": [round(b - a, 3) for a, b in zip(times[:args.warmup - 1], times[1:args.warmup])],
            "loss_trajectory": losses}


def worker_hf(args, device: str = "cpu") -> dict:
    """HF GPTNeo's training speed on the CPU or (bench_gpu.py) device "cuda", in args.precision (bfloat16 and
    float16 as autocast), under torch.compile where args.compile: the forward pass and the loss compiled as one
    function (inductor, default mode), the backward pass through the compiled graph's own backward."""
    import torch
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    m = model_args(args)
    torch.manual_seed(0)
    if device == "cpu":
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    rss_framework = current_rss()
    config = GPTNeoConfig(vocab_size=m["n_vocab"], max_position_embeddings=m["n_ctx"], hidden_size=m["n_embd"],
                          num_layers=m["n_layer"], num_heads=m["n_head"],
                          attention_types=[[["global", "local"], m["n_layer"] // 2]] if m["n_layer"] % 2 == 0 else
                          [[["global"], m["n_layer"]]], window_size=m["window"],
                          activation_function="gelu_new", resid_dropout=0.0, embed_dropout=0.0, attention_dropout=0.0)
    model = GPTNeoForCausalLM(config).to(device)
    model.train()
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(args.precision)
    # float16 as PyTorch trains it: autocast plus a dynamic loss scale (this project scales its loss the same way)
    scaler = torch.amp.GradScaler(device, enabled=dtype == torch.float16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                  fused=True)
    data = torch.randint(0, m["n_vocab"], (64, m["n_ctx"] + 1), generator=torch.Generator().manual_seed(0)).to(device)

    def forward_loss(batch):
        with torch.autocast(device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(input_ids=batch[:, :-1]).logits
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, m["n_vocab"]), batch[:, 1:].reshape(-1))

    if getattr(args, "compile", False):
        forward_loss = torch.compile(forward_loss)
    times, cpu_times, losses = [], [], []
    for step in range(args.warmup + args.steps):
        rows = torch.arange(step * m["batch"], (step + 1) * m["batch"]) % data.shape[0]
        loss = forward_loss(data[rows.to(device)])
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if device != "cpu":
            torch.cuda.synchronize()  # the step's kernels are queued: time them done
        times.append(time.perf_counter())
        cpu_times.append(time.process_time())
        losses.append(float(loss))
    seconds = times[-1] - times[args.warmup - 1]
    tokens = args.steps * m["batch"] * m["n_ctx"]
    result = {"tokens_per_s": tokens / seconds, "step_s": seconds / args.steps, "first_loss": losses[0],
              "last_loss": losses[-1], "peak_rss": peak_rss(), "rss_framework": rss_framework,
              "step_times": [round(b - a, 3) for a, b in zip(times[args.warmup - 1:], times[args.warmup:])],
            # the process's CPU seconds per step (all its threads): on a shared machine, what other work does not
            # stretch as it stretches the wall time (two commits compared on one pinned core: --cpus 0)
            "cpu_s_per_step": (cpu_times[-1] - cpu_times[args.warmup - 1]) / args.steps}
    if device == "cpu":
        result.update(torch_threads=torch.get_num_threads(),
                      torch_fp32_matmul_flops=torch_matmul_peak(args.peak_size, args.peak_seconds),
                      torch_bf16_matmul_flops=torch_matmul_peak(args.peak_size, args.peak_seconds, torch.bfloat16))
    return result


def torch_matmul_peak(size: int, seconds: float, dtype=None) -> float:
    """PyTorch's own square-matmul FLOP/s here in `dtype` (default fp32; its BLAS or oneDNN, not TF's), timed as
    long as one of TF's two paths: how fast HF's matmuls could run, which differs from TF's peak by CPU vendor and
    BLAS build."""
    import torch

    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    return best_matmul_rate(lambda: a @ b, size, seconds / 2)


WORKERS = {"peak": worker_peak, "ours": worker_ours, "hf": worker_hf}


# ---------------------------------------------------------------------------------------------------------
# Driver


def run_worker(kind: str, args, variant: str = "float32", peer: bool = False) -> dict:
    """One measurement in a fresh process: this checkout's worker, or (peer) the peer checkout's own worker
    under the peer's Python (its stack: e.g. an older commit on TensorFlow 2.15). `variant` is a precision with
    an optional +xla (ours) or +compile (HF), and for ours an optional @mode of worker.JIT_MODES (--auto_jit)."""
    variant, _, jit = variant.partition("@")
    precision, _, extra = variant.partition("+")
    python, root = (args.peer_python, os.path.abspath(args.peer_repo)) if peer else (sys.executable, ROOT)
    command = [python, os.path.join(root, "bench", "bench_train.py"), "--worker", kind, "--precision", precision]
    if extra:
        command.append("--" + extra)
    for key, value in vars(args).items():
        if key in ("worker", "precision", "variants", "peers", "repeats", "skip_hf", "xla", "compile", "peer_python",
                   "peer_repo", "shape", "auto_jit"):
            continue
        command += [f"--{key}", str(value)]
    started = time.time()
    result = subprocess.run(command, capture_output=True, text=True, cwd=root,
                            env=worker.jit_environment(jit or "default"))
    lines = [l for l in result.stdout.splitlines() if l.startswith(MARK)]
    if result.returncode != 0 or not lines:
        killed = " (killed by SIGKILL: out of memory? see dmesg)" if result.returncode == -9 else ""
        raise SystemExit(f"error: the {kind} worker failed with exit code {result.returncode}{killed}:\n"
                         f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    values = json.loads(lines[-1][len(MARK):])
    values.update(measure=("peer " if peer else "") + kind, variant=variant + (f"@{jit}" if jit else ""),
                  wall_s=round(time.time() - started, 1),
                  load=load())
    print(json.dumps(values), flush=True)
    return values


def best(results: list[dict]) -> dict:
    return max(results, key=lambda r: r["tokens_per_s"])


def parse(argv=None) -> argparse.Namespace:
    """The command line, with --shape's model, context, window and batch filled in where not given."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="bench",
                   help="bench: 6 x 512, context 256, window 128, batch 8; neo: 6 x 512 at GPT-Neo's context 2048, "
                        "window 256, batch 1; 125m: GPT-Neo 125M (12 x 768, 12 heads, vocabulary 50257, context "
                        "2048, window 256, batch 1). The flags below override its values")
    p.add_argument("--n_layer", type=int)
    p.add_argument("--n_embd", type=int)
    p.add_argument("--n_head", type=int)
    p.add_argument("--n_ctx", type=int, help="context (default: the shape's)")
    p.add_argument("--n_vocab", type=int)
    p.add_argument("--batch", type=int, help="batch size (default: the shape's)")
    p.add_argument("--window", type=int, help="local attention window, HF's window_size (default: the shape's)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (graph build or compilation, "
                   "allocator warm-up)")
    p.add_argument("--steps", type=int, default=8, help="timed steps")
    p.add_argument("--repeats", type=int, default=1, help="measure each N times, interleaved; keep the best")
    p.add_argument("--variants", nargs="+", choices=VARIANTS,
                   help="this project's set-ups to measure: precision, +xla for XLA element-wise fusion "
                        "(execution/xla.py, main.py --xla) (default: float32, and bfloat16 where the CPU has bf16 "
                        "matrix units)")
    p.add_argument("--peers", nargs="+", choices=PEERS,
                   help="HF's set-ups to measure: precision (bfloat16 as autocast), +compile for torch.compile "
                        "(default: float32 and float32+compile, and their bfloat16 where the CPU has bf16 matrix "
                        "units)")
    p.add_argument("--skip_hf", action="store_true", help="only this project")
    p.add_argument("--auto_jit", action="store_true",
                   help="also measure each of ours under XLA auto-clustering, and with XLA's oneDNN matmuls "
                        "(bench/worker.py's JIT_MODES), interleaved with the default in every repeat; prints the "
                        "ratios")
    p.add_argument("--peak_size", type=int, default=1024)
    p.add_argument("--peak_seconds", type=float, default=3.0)
    p.add_argument("--cpus", default="", help="run every measurement on these CPUs only, e.g. 0 or 0,1 (default: "
                   "all); on a shared machine one pinned core is disturbed less than all cores")
    p.add_argument("--peer_python", help="also measure the peer checkout --peer_repo under this Python (its own "
                   "stack), interleaved with ours, and print ours / peer")
    p.add_argument("--peer_repo", help="the peer checkout, e.g. a worktree of an older commit")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--precision", default="float32", help=argparse.SUPPRESS)
    p.add_argument("--xla", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for key, value in SHAPES[args.shape].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def peer_name(variant: str) -> str:
    precision, _, extra = variant.partition("+")
    return f"HF {'compile' if extra == 'compile' else 'eager'} {precision}"


def measure(args) -> dict:
    """Runs the measurements `args` asks for, interleaved, printing one JSON line each; returns the summary the
    table prints (best of the repeats per set-up, peaks, ratios)."""
    if bool(args.peer_python) != bool(args.peer_repo):
        raise SystemExit("error: --peer_python and --peer_repo go together")
    if args.peer_python:  # the peer's workers run in --peer_repo: a relative path would be looked up from there
        found = shutil.which(args.peer_python)
        if not found:
            raise SystemExit(f"error: --peer_python {args.peer_python} is not an executable: give the peer's Python")
        if not os.path.isdir(args.peer_repo):
            raise SystemExit(f"error: --peer_repo {args.peer_repo} is not a folder: give the peer's checkout")
        args.peer_python = os.path.abspath(found)
    if args.warmup < 1 or args.steps < 1:
        raise SystemExit(f"error: --warmup and --steps must be at least 1 (got {args.warmup} and {args.steps}): the "
                         f"clock starts at the end of the last warm-up step")
    from devices import precision  # the driver only: the HF worker's process stays free of TensorFlow
    cpu_name, flags = precision.cpu_info()
    bf16_units = bool(precision.units(flags))
    auto = precision.choose("auto", "CPU", flags).precision
    if args.variants is None:
        args.variants = ["float32"] + (["bfloat16"] if bf16_units else [])
    if args.peers is None:
        args.peers = [p for p in PEERS if bf16_units or not p.startswith("bfloat16")]
    if args.skip_hf:
        args.peers = []
    cpu = precision.cpu_kind(cpu_name, flags)
    print(f"# {cpu}; precision auto trains in {auto} here; TF_ENABLE_ONEDNN_OPTS="
          f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', '(unset: TensorFlow decides by the CPU)')}", flush=True)
    print(f"# {os.cpu_count()} CPUs{' (measuring on CPUs ' + args.cpus + ')' if args.cpus else ''}, load average "
          f"{load()} at start", flush=True)
    load_start = load()
    peaks, ours, hf = [], {v: [] for v in args.variants}, {v: [] for v in args.peers}
    peer = {v: [] for v in args.variants}
    jit = {(v, mode): [] for v in args.variants for mode in worker.JIT_MODES}
    for _ in range(args.repeats):
        peaks.append(run_worker("peak", args))
        for variant in args.variants:
            ours[variant].append(run_worker("ours", args, variant))
            for mode in list(worker.JIT_MODES)[1:] if args.auto_jit else []:
                jit[variant, mode].append(run_worker("ours", args, f"{variant}@{mode}"))
            if args.peer_python:
                peer[variant].append(run_worker("ours", args, variant, peer=True))
        for variant in args.peers:
            hf[variant].append(run_worker("hf", args, variant))
    peaks.append(run_worker("peak", args))  # before and after: how much the machine moved meanwhile
    summary = summarize(peaks, ours, hf, auto)
    summary.update(shape=args.shape, model=model_args(args), warmup=args.warmup, steps=args.steps,
                   repeats=args.repeats, cpu=cpu, bf16_units=bf16_units, load_start=load_start, load_end=load())
    if args.peer_python:
        summary["peer"] = {v: (best(ours[v])["tokens_per_s"], best(peer[v])["tokens_per_s"]) for v in args.variants}
    if args.auto_jit:
        summary["auto_jit"] = jit_summary({**{(v, "default"): ours[v] for v in args.variants},
                                           **{k: runs for k, runs in jit.items() if runs}})
    return summary


def jit_summary(runs: dict) -> list:
    """--auto_jit's rows, per (variant, mode): the median tokens/s over the repeats and its ratio to the same
    variant's default, the median seconds to the first step's end and of the other warm-up steps, and the largest
    difference of its losses from the default's (its first repeat's, step by step)."""
    import statistics
    rows = []
    for (variant, mode), results in runs.items():
        default = runs[variant, "default"]
        tokens = statistics.median(r["tokens_per_s"] for r in results)
        reference = default[0]["loss_trajectory"]
        rows.append(dict(variant=variant, mode=mode, tokens_per_s=tokens, repeats=[round(r["tokens_per_s"], 1)
                         for r in results], ratio=tokens / statistics.median(r["tokens_per_s"] for r in default),
                         to_first_step_s=statistics.median(r["to_first_step_s"] for r in results),
                         warmup_steps_s=statistics.median(sum(r["warmup_step_times"]) for r in results),
                         loss_difference=max(abs(a - b) for r in results for a, b in zip(r["loss_trajectory"],
                                                                                          reference))))
    return rows


def summarize(peaks: list, ours: dict, hf: dict, auto: str) -> dict:
    """The table's rows from the runs (per set-up, the best of its repeats): tokens/s, model FLOP/s, MFU against
    TF's matmul peak in the precision that ran, peak RSS; the best peer and ours (in `auto`'s precision) / it."""
    peak = {"float32": max(p_["fp32_matmul_flops"] for p_ in peaks),
            "bfloat16": max(p_["bf16_matmul_flops"] for p_ in peaks)}
    fpt = best(next(iter(ours.values())))["flops_per_token"] if ours else 0.0
    rows = []
    for side, results in [("ours", ours), ("hf", hf)]:
        for variant, runs in results.items():
            r = best(runs)
            precision_ran = variant.partition("+")[0]
            flops = r["tokens_per_s"] * fpt
            rows.append(dict(side=side, variant=variant, precision=precision_ran,
                             name=f"ours {variant}" + (" (auto)" if variant == auto else "") if side == "ours"
                             else peer_name(variant), tokens_per_s=r["tokens_per_s"], step_s=r["step_s"],
                             flops=flops, mfu=flops / peak.get(precision_ran, peak["float32"]),
                             peak_rss=r.get("peak_rss"), repeats=[round(x["tokens_per_s"], 1) for x in runs]))
    peer_rows = [r for r in rows if r["side"] == "hf"]
    best_peer = max(peer_rows, key=lambda r: r["tokens_per_s"]) if peer_rows else None
    ours_auto = next((r for r in rows if r["side"] == "ours" and r["variant"] == auto), None) or \
        next((r for r in rows if r["side"] == "ours"), None)
    summary = dict(auto=auto, peak=peak, fp32_peak_range=[min(p_["fp32_matmul_flops"] for p_ in peaks),
                                                          peak["float32"]],
                   rows=rows, best_peer=best_peer["name"] if best_peer else None,
                   ratio=ours_auto["tokens_per_s"] / best_peer["tokens_per_s"] if best_peer and ours_auto else None)
    runs = [r for results in hf.values() for r in results if r.get("torch_fp32_matmul_flops")]
    if runs:
        summary["torch_peak"] = {"float32": max(r["torch_fp32_matmul_flops"] for r in runs),
                                 "bfloat16": max(r.get("torch_bf16_matmul_flops", 0.0) for r in runs)}
    return summary


def gib(n) -> str:
    return f"{n / 2 ** 30:.2f}" if n else "-"


def print_table(s: dict, args) -> None:
    m = s["model"]
    print(f"\nshape {s['shape']}: {m['n_layer']} layers x {m['n_embd']} wide, {m['n_head']} heads, ctx {m['n_ctx']}, "
          f"vocab {m['n_vocab']}, batch {m['batch']}, global/local (window {m['window']}); {s['warmup']} warm-up + "
          f"{s['steps']} timed steps, best of {s['repeats']}")
    print(f"matmul peak (TF, {args.peak_size}^2): fp32 {s['peak']['float32'] / 1e9:.1f} GFLOP/s, bf16 "
          f"{s['peak']['bfloat16'] / 1e9:.1f} GFLOP/s (fp32's range over the run: "
          f"{s['fp32_peak_range'][0] / 1e9:.1f}..{s['fp32_peak_range'][1] / 1e9:.1f})")
    best_peer = next((r for r in s["rows"] if r["name"] == s["best_peer"]), None)
    print(f"{'':<28}{'tokens/s':>10}{'s/step':>9}{'GFLOP/s':>10}{'MFU':>8}{'(of)':>6}{'peak RSS GiB':>14}"
          f"{'/ best peer':>13}")
    for r in s["rows"]:
        ratio = f"{r['tokens_per_s'] / best_peer['tokens_per_s']:.2f}x" if best_peer else "-"
        print(f"{r['name']:<28}{r['tokens_per_s']:>10,.0f}{r['step_s']:>9.2f}{r['flops'] / 1e9:>10.1f}"
              f"{100 * r['mfu']:>7.1f}%{'bf16' if r['precision'] == 'bfloat16' else 'fp32':>6}{gib(r['peak_rss']):>14}"
              f"{ratio:>13}")
    if s.get("torch_peak"):
        print(f"matmul peak (PyTorch, {args.peak_size}^2): fp32 {s['torch_peak']['float32'] / 1e9:.1f} GFLOP/s, bf16 "
              f"{s['torch_peak']['bfloat16'] / 1e9:.1f} GFLOP/s (TF's / PyTorch's: fp32 "
              f"{s['peak']['float32'] / s['torch_peak']['float32']:.2f}x, bf16 "
              f"{s['peak']['bfloat16'] / max(s['torch_peak']['bfloat16'], 1.0):.2f}x)")
    for variant, (a, b) in s.get("peer", {}).items():
        print(f"{'peer ' + variant:<28}{b:>10,.0f}; ours / peer {a / b:.2f}x  ({args.peer_repo} under "
              f"{args.peer_python})")
    ours = {r["variant"]: r for r in s["rows"] if r["side"] == "ours"}
    for suffix in ("", "+xla"):
        fp32, bf16 = ours.get("float32" + suffix), ours.get("bfloat16" + suffix)
        if fp32 and bf16:
            print(f"bf16 / fp32{suffix} (this project): {bf16['tokens_per_s'] / fp32['tokens_per_s']:.2f}x; "
                  f"bf16 / fp32 matmul peak: {s['peak']['bfloat16'] / s['peak']['float32']:.2f}x")
    if s.get("auto_jit"):
        print(f"XLA auto-clustering (--auto_jit), median of {s['repeats']} interleaved repeats:")
        for r in s["auto_jit"]:
            print(f"  ours {r['variant']:<10} {r['mode']:<16} {r['tokens_per_s']:>8,.0f} tokens/s {r['repeats']} "
                  f"{r['ratio']:.2f}x the default; first step's end {r['to_first_step_s']:.1f} s, other warm-up "
                  f"steps {r['warmup_steps_s']:.1f} s; losses differ by {r['loss_difference']:.2g} at most")
    if s["ratio"]:
        print(f"headline: ours ({s['auto']}, what precision auto picks here) / best peer ({s['best_peer']}): "
              f"{s['ratio']:.2f}x")
    print(f"# load average {s['load_end']} at end")


def main(argv=None) -> int:
    return worker.main(parse(argv), WORKERS, measure, print_table)


if __name__ == "__main__":
    sys.exit(main())
