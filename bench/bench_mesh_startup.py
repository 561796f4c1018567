"""Start-up of a training on a mesh of 1, 2 and 4 CPU devices: where the CPU seconds before the second step go.

    .venv/bin/python bench/bench_mesh_startup.py                  # 1, 2 and 4 devices, every mode below
    .venv/bin/python bench/bench_mesh_startup.py --meshes x:2,y:2 --modes cold warm

The model is the tests' tiny one (tests/tiny.py: 2 layers, 32 wide, batch 4, context 16), trained through the
project's runner as tests/tiny.py's `train` does (train/loop.py's training program; devices/placement.py's
session config). Each run is a fresh process of its own, timed with its CPU seconds (all threads): building the
step's graph (mesh-tensorflow's lowering: Python), opening the session (initialising the variables and copying
them to the mesh's slices), the first step's session call (grappler, partitioning, the executors and kernels,
XLA's compilations) and the second step's. Modes:

    cold    XLA kernels, an empty persistent compile cache (--tf_xla_persistent_cache_directory)
    warm    the same again: the cache now holds this run's kernels
    after   the same cache, in a process that first built a 1-device training graph (the cache is found only
            when a kernel's name does not depend on what the process built before: models/kernels/common.py)
    tfdefault  warm, with grappler's passes as TensorFlow sets them (the CPU sessions' cuts undone:
            devices/placement.py's lean_grappler and the remapper)
    plain   the fused kernels as plain TF ops (--plain_kernels): no XLA at all
    bare    plain, and grappler off (RewriterConfig.disable_meta_optimizer): what is left is TF's own

cold - plain is XLA's share of the first call, plain - bare grappler's, tfdefault - warm what the CPU cuts save. /proc/loadavg is printed before and
after: on a machine shared with other work the CPU seconds inflate too (TensorFlow's threads spin while waiting).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESHES = {"all:1": "", "x:2": "batch:x", "x:2,y:2": "batch:x,heads:y"}
MODES = ("cold", "warm", "after", "tfdefault", "plain", "bare")


def worker(mesh_shape: str, layout: str, mode: str) -> dict:
    """One training's start-up in this process: CPU seconds of each part, and the graph's op count."""
    sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
    import conftest  # noqa: F401  (the tests' set-up: 4 CPU devices, runtime defaults)
    from devices.placement import Placement
    from execution.runner import fixed_batches
    from models.optimizers import slot_patterns
    from tiny import random_tokens, tiny_config
    from train.loop import training_program

    if mode in ("bare", "tfdefault"):
        session_config = Placement.session_config

        def grappler_changed(self):
            config = session_config(self)
            config.graph_options.rewrite_options.Clear()  # TF's defaults
            config.graph_options.rewrite_options.disable_meta_optimizer = mode == "bare"
            return config
        Placement.session_config = grappler_changed
    kernels = "plain" if mode in ("plain", "bare") else "xla"
    data = random_tokens([8, 17])
    if mode == "after":
        one = tiny_config()
        training_program(one, Placement(devices=tuple(conftest.CPU_DEVICES[:1]), kernels=kernels),
                         fixed_batches(data, one.train_batch_size), 0)
    cfg = tiny_config(mesh_shape=mesh_shape, layout=layout)
    placement = Placement(devices=tuple(conftest.CPU_DEVICES[:cfg.n_devices]), kernels=kernels)
    times = [time.process_time()]
    program = training_program(cfg, placement, fixed_batches(data, cfg.train_batch_size), 0)
    times.append(time.process_time())
    session = program.open(None, slot_patterns())
    program.start(session.session)
    times.append(time.process_time())
    program.run(session.session, 1)
    times.append(time.process_time())
    program.run(session.session, 1)
    times.append(time.process_time())
    session.close()
    parts = ("build", "open", "first", "second")
    return {"ops": len(program.graph.get_operations()),
            **{part: round(times[i + 1] - times[i], 3) for i, part in enumerate(parts)}}


def run(mesh_shape: str, layout: str, mode: str, cache: str) -> dict:
    env = dict(os.environ, TF_XLA_FLAGS=f"--tf_xla_persistent_cache_directory={cache}", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, __file__, "--worker", mesh_shape, layout, mode], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"error: the {mode} run on {mesh_shape} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meshes", nargs="+", default=list(MESHES), choices=list(MESHES))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, "
          f"load average {open('/proc/loadavg').read().split()[:3]}")
    print(f"{'mesh':10s} {'mode':9s} {'ops':>6s} {'build':>6s} {'open':>6s} {'first':>6s} {'second':>7s}   CPU s")
    for mesh_shape in args.meshes:
        with tempfile.TemporaryDirectory(prefix="bench-xla-cache-") as cache:
            for mode in args.modes:
                r = run(mesh_shape, MESHES[mesh_shape], mode, cache)
                print(f"{mesh_shape:10s} {mode:9s} {r['ops']:6d} {r['build']:6.2f} {r['open']:6.2f} "
                      f"{r['first']:6.2f} {r['second']:7.3f}", flush=True)
    print(f"load average after: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
