"""What one fused XLA kernel costs inside a training step, against its cost alone: the question the traced
profile left open (docs/measured.md: LayerNorm's forward at the bench shape took 1.6 ms a call in
profile_train.py's traced step, 0.1 ms in a loop of its own).

    .venv/bin/python bench/bench_kernel_cost.py                          # LayerNorm's forward, bench shape (~4 min)
    .venv/bin/python bench/bench_kernel_cost.py --kernel gelu --extra 8 --precision float32
    .venv/bin/python bench/bench_kernel_cost.py --kernel bias_gelu       # bf16 MLPs add c_fc's bias in GELU's kernel

No tracing: in the "extra" runs every call of the kernel in bench_train.py's training step (same model, shape,
data and precision) is preceded by --extra more calls, a chain each on the last one's output, whose end the real
call reads: all on the step's critical path, so the untraced step grows by
what those calls cost where they run: (fastest step with extra - fastest plain step) / (extra calls per step).
Plain and extra runs alternate, each a process of its own (--repeats pairs). The "alone" line times the same
chain of calls on a tensor of the step's shape in a graph of its own (no training around it): the per-call
difference between chains of 1 and 1 + --alone_calls calls, with TF's intra-op threads (one a core) and with one:
whether XLA:CPU splits the kernel over the cores (it splits loop fusions, not fusions with row reductions).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()

import bench_train  # noqa: E402
import worker  # noqa: E402
from worker import MARK  # noqa: E402

# kernel -> (models/kernels/elementwise.py's function, the width of its input: times n_embd)
KERNELS = {"layer_norm": ("_layer_norm_forward", 1), "gelu": ("_gelu_forward", 4),
           "bias_gelu": ("_bias_gelu_forward", 4)}


class Repeated:
    """An XLA kernel (a tf.function whose first output has its first argument's shape and dtype) that runs `extra`
    more times before each call: a chain, each call on the last one's first output, and the real call on the
    chain's end. A data dependency, not a control one: grappler turns a stateless op that only a control edge
    reads into a NoOp (seen: every extra call gone from the step), and merges calls on the same input. The step
    then computes other values (LayerNorm of LayerNorm, ...), at the same shapes: each call's cost depends on
    those, not on the values. `calls` counts the real calls traced."""

    def __init__(self, kernel, extra: int):
        self.kernel, self.extra, self.calls = kernel, extra, 0
        self.python_function = kernel.python_function  # models/kernels/common.fused's plain path: untouched

    def __call__(self, x, *rest):
        import tensorflow.compat.v1 as tf
        self.calls += 1
        for _ in range(self.extra):
            x = tf.nest.flatten(self.kernel(x, *rest))[0]
        return self.kernel(x, *rest)


def patch(kernel: str, extra: int) -> Repeated:
    """models/kernels/elementwise.py's `kernel` replaced by a Repeated one, for the graphs built from now on (the
    lowering looks the function up by name when it builds)."""
    from models.kernels import elementwise
    name = KERNELS[kernel][0]
    repeated = Repeated(getattr(elementwise, name), extra)
    setattr(elementwise, name, repeated)
    return repeated


def worker_train(args) -> dict:
    """bench_train.py's training worker with the kernel called args.extra more times a call."""
    repeated = patch(args.kernel, args.extra)
    result = bench_train.worker_ours(args)
    result.update(calls_per_step=repeated.calls, extra=args.extra)
    return result


def kernel_inputs(kernel: str, args, tf):
    """The kernel's arguments at the step's shape: activations [batch x n_ctx, width] in the step's precision."""
    import numpy as np
    width = KERNELS[kernel][1] * args.n_embd
    dtype = tf.bfloat16 if args.precision == "bfloat16" else tf.float32
    rng = np.random.RandomState(0)

    def variable(value):  # not a constant: grappler would fold the kernels over constants before the first call
        return tf.Variable(tf.cast(value.astype(np.float32), dtype))
    x = variable(rng.randn(args.batch * args.n_ctx, width))
    if kernel == "layer_norm":
        return x, variable(np.ones(width)), variable(np.zeros(width)), 1e-5
    if kernel == "bias_gelu":
        return x, variable(rng.randn(width))
    return (x,)


def worker_alone(args) -> dict:
    """ms per call of the kernel alone: chains of 1 and 1 + args.alone_calls calls (Repeated), the median of
    args.alone_runs session calls each, on one CPU device as the step runs, with args.alone_threads intra-op
    threads (0: TF's default, one a core)."""
    import models  # noqa: F401
    import tensorflow.compat.v1 as tf
    from devices.placement import Placement, configure
    from models.kernels import elementwise

    if args.alone_threads:  # before anything initialises TF's context: the threads its devices' pools get
        tf.config.threading.set_intra_op_parallelism_threads(args.alone_threads)
    placement = Placement(tuple(configure(["device:CPU:0"])))
    kernel = getattr(elementwise, KERNELS[args.kernel][0])
    medians = {}
    for extra in (0, args.alone_calls):
        graph = tf.Graph()
        with graph.as_default():
            out = tf.nest.flatten(Repeated(kernel, extra)(*kernel_inputs(args.kernel, args, tf)))[0]
            total = tf.reduce_sum(tf.cast(out[:1], tf.float32))  # a scalar fetched: no copy of the output timed
            initialise = tf.global_variables_initializer()
        with tf.Session(graph=graph, config=placement.session_config()) as session:
            session.run(initialise)
            for _ in range(3):
                session.run(total)
            times = []
            for _ in range(args.alone_runs):
                start = time.perf_counter()
                session.run(total)
                times.append(time.perf_counter() - start)
        medians[extra] = statistics.median(times)
    return {"ms_per_call": 1000 * (medians[args.alone_calls] - medians[0]) / args.alone_calls,
            "one_call_ms": 1000 * medians[0]}


WORKERS = {"train": worker_train, "alone": worker_alone}


def run_worker(kind: str, args, extra: int = 0, threads: int = 0) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--kernel", args.kernel, "--extra",
               str(extra), "--shape", args.shape, "--precision", args.precision, "--warmup", str(args.warmup),
               "--steps", str(args.steps), "--alone_calls", str(args.alone_calls), "--alone_runs",
               str(args.alone_runs), "--alone_threads", str(threads)]
    run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in run.stdout.splitlines() if line.startswith(MARK)]
    if run.returncode or not lines:  # as bench_train.run_worker: one error line, exit code 1
        raise SystemExit(f"error: the {kind} worker failed (exit code {run.returncode}):\n{run.stderr[-3000:]}")
    return json.loads(lines[-1][len(MARK):])


def per_call_ms(plain: list[dict], extra: list[dict]) -> float:
    """The extra calls' ms each: the fastest step's growth over the plain runs' fastest, per extra call in a step
    (a step's time varies with what else the machine runs, by tens of ms on 2 cores; never below its cost)."""
    def fastest_step(runs):
        return min(t for r in runs for t in r["step_times"])
    calls = extra[0]["extra"] * extra[0]["calls_per_step"]
    return 1000 * (fastest_step(extra) - fastest_step(plain)) / calls


def measure(args) -> dict:
    plain, extra = [], []
    for repeat in range(args.repeats):
        for runs, count in ((plain, 0), (extra, args.extra)):
            print(f"  repeat {repeat + 1}/{args.repeats}: step with {count} extra calls ...", flush=True)
            runs.append(run_worker("train", args, count))
            if not runs[-1]["calls_per_step"]:  # the plain run counts the calls too: known after the first run
                raise SystemExit(f"error: the {args.precision} step never calls {KERNELS[args.kernel][0]}: pick "
                                 f"the kernel it runs (bf16 MLPs run bias_gelu, fp32 ones gelu)")
    print("  the kernel alone ...", flush=True)
    alone, alone_one = run_worker("alone", args), run_worker("alone", args, threads=1)
    return {"plain": plain, "extra": extra, "alone": alone, "alone_one_thread": alone_one,
            "in_step_ms_per_call": per_call_ms(plain, extra)}


def print_table(s: dict, args) -> None:
    from devices import precision
    calls = s["extra"][0]["calls_per_step"]
    print(f"# {precision.cpu_kind(*precision.cpu_info())}")
    print(f"shape {args.shape} ({args.n_layer} x {args.n_embd}, ctx {args.n_ctx}, batch {args.batch}), "
          f"{args.precision}; kernel {args.kernel}: {calls} calls a step, {args.extra} extra before each")
    for name in ("plain", "extra"):
        steps = [t for r in s[name] for t in r["step_times"]]
        print(f"  step, {name:<5}: median {1000 * statistics.median(steps):.1f} ms, min {1000 * min(steps):.1f} ms "
              f"({len(steps)} steps, {len(s[name])} runs)")
    print(f"  {args.kernel} in the step: {s['in_step_ms_per_call']:.3f} ms a call (untraced); alone: "
          f"{s['alone']['ms_per_call']:.3f} ms a call, {s['alone_one_thread']['ms_per_call']:.3f} on one intra-op "
          f"thread")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", choices=sorted(KERNELS), default="layer_norm")
    p.add_argument("--extra", type=int, default=32, help="extra calls before each call in the step: enough that the step grows by well over its own spread (tens of ms; 2 extra LayerNorm calls gave 1.0 ms a call, 8 gave 0.39, 32 gave 0.48)")
    p.add_argument("--shape", choices=sorted(bench_train.SHAPES), default="bench")
    p.add_argument("--precision", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3, help="pairs of plain and extra runs, interleaved")
    p.add_argument("--alone_calls", type=int, default=64)
    p.add_argument("--alone_runs", type=int, default=20)
    p.add_argument("--alone_threads", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    shaped = bench_train.parse(["--shape", args.shape, "--precision", args.precision, "--warmup", str(args.warmup),
                                "--steps", str(args.steps)])
    for key, value in vars(shaped).items():
        if not hasattr(args, key):
            setattr(args, key, value)
    return args


def main(argv=None) -> int:
    return worker.main(parse(argv), WORKERS, measure, print_table)


if __name__ == "__main__":
    sys.exit(main())
