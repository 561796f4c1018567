"""The benches' two halves in one script: run as a worker (`--worker KIND`), it measures one side in a process of
its own and prints one line, MARK + JSON, that the parent's run_worker reads; run without, it measures every side
and prints the table."""
from __future__ import annotations

import json
import os

from console.environment import XLA_CACHE_FLAG

MARK = "BENCH_RESULT "
# XLA auto-clustering of a whole program (`--auto_jit`): TensorFlow's own clustering of every op XLA compiles, on
# the CPU too (not only `--xla`'s element-wise ops); with `+onednn` XLA:CPU's oneDNN matmuls besides
# (`--xla_cpu_use_onednn`, a flag TensorFlow 2.21's XLA knows). Each mode is the environment of a worker process.
AUTO_JIT_FLAGS = "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit"
JIT_MODES = {"default": {}, "auto_jit": {"TF_XLA_FLAGS": AUTO_JIT_FLAGS},
             "auto_jit+onednn": {"TF_XLA_FLAGS": AUTO_JIT_FLAGS, "XLA_FLAGS": "--xla_cpu_use_onednn=true"}}


def jit_environment(mode: str, environ=os.environ) -> dict:
    """The environment of a worker run in JIT_MODES' `mode`: its flags added to the ones already set. A mode that
    changes XLA_FLAGS also drops the XLA compile cache's folder this process chose, so that the worker keys its
    own by its XLA_FLAGS (console/environment.py): code compiled with other flags is not loaded."""
    env = dict(environ)
    for name, flags in JIT_MODES[mode].items():
        env[name] = " ".join(filter(None, [flags, environ.get(name, "")]))
    if "XLA_FLAGS" in JIT_MODES[mode]:
        env["TF_XLA_FLAGS"] = " ".join(f for f in env.get("TF_XLA_FLAGS", "").split()
                                       if not f.startswith(XLA_CACHE_FLAG))
    return env


def main(args, workers: dict, measure, print_table) -> int:
    """A worker's one result line (pinned to --cpus first, before TF or torch size their thread pools), or the
    whole measurement and its table."""
    if args.worker:
        if args.cpus:
            os.sched_setaffinity(0, [int(c) for c in args.cpus.split(",")])
        print(MARK + json.dumps(workers[args.worker](args)), flush=True)
        return 0
    print_table(measure(args), args)
    return 0
