"""Where a training step's time goes, op by op: this project (TF's step timeline) beside HF's GPTNeo
(torch.profiler), same model and shape as bench/bench_train.py.

    .venv/bin/python bench/profile_train.py                  # the bench shape (context 256, batch 8)
    .venv/bin/python bench/profile_train.py --shape neo      # GPT-Neo's shape (context 2048, window 256, batch 1)
    .venv/bin/python bench/profile_train.py --shape neo --precision bfloat16 --sequential   # bf16 (HF: autocast)

Each side runs in its own process: --warmup untimed steps, then --steps profiled ones (ours: one session call
each with RunOptions(trace_level=FULL_TRACE), the step's RunMetadata.step_stats; HF: torch.profiler over the
steps, each op's self CPU time). Op times are sorted into categories by op type and name scope: the matmuls of
the projections and of attention, the rest of attention (softmax, mask), LayerNorm, GELU, the loss, the
optimizer (Adam, clipping), the embedding's gradient, copies (transposes, reshapes, casts, concats) and other.

Per category: milliseconds of op time per step and its share of all op time. The two frameworks count
differently: TF's executor runs independent ops side by side on its inter-op threads (op time can exceed the
step's wall time), PyTorch runs them one after another on one thread (each op's intra-op threads inside it),
so compare shares and the wall times printed beside them, not the op-time sums. With --sequential ours runs one
op at a time too (each op still on every core): its op times then add up to the step's wall time, which is
within a percent of the unprofiled step's on this project's 2-core machine.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()

import bench_train  # noqa: E402

MARK = "PROFILE_RESULT "
CATEGORIES = ("matmul: projections", "matmul: output logits (tied embedding)", "matmul: attention",
              "attention: softmax, mask", "LayerNorm", "GELU", "bias gradients (sums)", "loss",
              "optimizer (Adam, clipping)", "embedding gradient", "copies (transpose, reshape, cast, concat)",
              "other")
MATMULS = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "_MklMatMul", "_FusedMatMul",
           "_MklFusedMatMul", "_MklNativeFusedMatMul", "_MklBatchMatMulV2", "_MklEinsum", "_MklFusedBatchMatMulV2")
COPIES = ("Transpose", "Reshape", "Cast", "ConcatV2", "Concat", "Slice", "StridedSlice", "Identity", "Pad", "_Send",
          "_Recv", "Pack", "Unpack", "Split", "SplitV", "Tile", "ExpandDims", "Squeeze")


def tf_category(op_type: str, name: str) -> str:
    """The category of one TF timeline entry (its op type and node name: the lowered graph keeps mtf's scopes,
    gpt2/h3/mlp/..., xentropy_final/..., adam_N/...; the gradient norm's square_N/reduce_N are top-level)."""
    lower = name.lower()
    if "wte_final" in lower and op_type in MATMULS:
        return "matmul: output logits (tied embedding)"
    if re.match(r"(adam|assign|square|reduce|global_norm|clip|sum_of_squares)", lower):
        return "optimizer (Adam, clipping)"  # sum_of_squares: the clipping's norm, an L2Loss per gradient
    if re.search(r"xentropy|cross_entropy|z_loss|logsumexp", lower):
        return "loss"
    if op_type in MATMULS and "layer_norm" in lower:  # its gradient's sums over the row, as products with ones
        return "LayerNorm"
    if (op_type in MATMULS or op_type == "Sum") and re.search(r"/bias_add/gradients/|/add/gradients/reduce", lower):
        return "bias gradients (sums)"  # dy summed over the tokens, a product with a row of ones
    if op_type in MATMULS:
        return "matmul: attention" if "/attention/" in lower and "transpose" not in lower else "matmul: projections"
    if op_type in ("UnsortedSegmentSum", "ScatterAdd", "ResourceScatterAdd") or "embd/gather/gradients" in lower:
        return "embedding gradient"
    if re.sub(r"^_Mkl(Native)?", "", op_type) in COPIES:  # oneDNN's rewrites (_MklTranspose) too
        return "copies (transpose, reshape, cast, concat)"
    if "/attention/" in lower or "softmax" in lower:
        return "attention: softmax, mask"
    if "norm" in lower:
        return "LayerNorm"
    if "gelu" in lower or "/mlp/" in lower:
        return "GELU"
    return "other"


def torch_category(name: str, phase: str, shapes: list, n_vocab: int, n_embd: int) -> str:
    """The category of one aten op in HF's step, from its name, the step phase it ran in (hf_forward, hf_loss,
    hf_backward, hf_clip, hf_optimizer: record_function scopes around each) and its input shapes. GPTNeo's
    projections are nn.Linear (addmm/mm; the logits' has the vocabulary in a shape), its attention torch.matmul
    on 4-d tensors (bmm), gelu_new tanh/pow/mul/add arithmetic on the 4 x n_embd-wide MLP activations."""
    n = name.lower()
    dims = {d for shape in shapes for d in (shape or [])}
    if phase in ("hf_optimizer", "hf_clip"):
        return "optimizer (Adam, clipping)"
    if phase == "hf_loss" or re.search(r"log_softmax|nll_loss", n):
        return "loss"
    if re.search(r"addmm|aten::mm\b|aten::linear", n):
        return "matmul: output logits (tied embedding)" if n_vocab in dims else "matmul: projections"
    if re.search(r"bmm|aten::matmul|baddbmm", n):
        return "matmul: attention"
    if re.search(r"softmax|aten::where|masked_fill", n):
        return "attention: softmax, mask"
    if "layer_norm" in n:
        return "LayerNorm"
    if "embedding" in n:
        return "embedding gradient"
    if re.search(r"tanh|pow|gelu", n) or (re.search(r"aten::(mul|add|div)", n) and 4 * n_embd in dims):
        return "GELU"
    if re.search(r"aten::sum\b", n) and phase == "hf_backward":
        return "bias gradients (sums)"
    if re.search(r"copy_|contiguous|clone|transpose|permute|view|reshape|_to_copy|aten::to\b|cat\b|expand|slice|"
                 r"select|split|unsqueeze|squeeze", n):
        return "copies (transpose, reshape, cast, concat)"
    return "other"


def timeline_ops(metadata) -> list:
    """(op type, node name, milliseconds) of each op that a session call traced with FULL_TRACE ran on the CPU
    devices (its RunMetadata's step_stats)."""
    ops = []
    for device in metadata.step_stats.dev_stats:
        if "/device:CPU" not in device.device or "stream" in device.device:
            continue
        for node in device.node_stats:
            op_type = node.timeline_label.split("(")[0].split("=")[-1].strip() if node.timeline_label else ""
            op_type = op_type.split()[0] if op_type else node.node_name
            ops.append((op_type, node.node_name, (node.all_end_rel_micros or node.op_end_rel_micros) / 1e3))
    return ops


def worker_ours(args) -> dict:
    import numpy as np
    import models  # noqa: F401
    import tensorflow.compat.v1 as tf
    from devices.placement import Placement, configure
    from execution import meshes
    from execution.mesh_session import MeshSession
    from train.step import training_step

    tf.get_logger().setLevel("ERROR")
    names = configure(["device:CPU:0"])
    placement = Placement(tuple(names))
    with tempfile.TemporaryDirectory() as folder:
        cfg = bench_train.bench_config(bench_train.model_args(args), args.precision, os.path.join(folder, "run"))
        data = np.random.RandomState(0).randint(0, cfg.n_vocab, size=[cfg.train_batch_size, cfg.n_ctx + 1])
        graph = tf.Graph()
        with graph.as_default(), tf.device(placement.device_function()):
            inputs = tf.constant(data[:, :-1].astype(np.int32))
            labels = tf.constant(data[:, 1:].astype(np.int32))
            mesh, impl = meshes.placement_mesh(cfg, placement)
            lowered = training_step(cfg, mesh, impl, inputs, labels)
        fetches = {"train": lowered.train_op, "loss": lowered.outputs["loss"]}
        totals, walls = collections.Counter(), []
        top = collections.Counter()
        config = placement.session_config()
        if args.sequential:  # one op at a time: each op's time is its own, and they add up to the step's
            config.inter_op_parallelism_threads = 1
        with MeshSession(graph, lowered.lowering, "", config, None) as session:
            for _ in range(args.warmup):
                session.run(fetches)
            for _ in range(args.steps):
                options = tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE)
                metadata = tf.RunMetadata()
                start = time.perf_counter()
                session.session.run(fetches, options=options, run_metadata=metadata)
                walls.append(time.perf_counter() - start)
                for op_type, node_name, ms in timeline_ops(metadata):
                    totals[tf_category(op_type, node_name)] += ms
                    top[(tf_category(op_type, node_name), op_type, re.sub(r"/h\d+/", "/h*/", node_name))] += ms
    return {"ms_per_step": {k: v / args.steps for k, v in totals.items()},
            "wall_ms": [round(1e3 * w, 1) for w in walls],
            "top": [[c, t, n, round(ms / args.steps, 1)] for (c, t, n), ms in top.most_common(args.top)]}


def worker_hf(args) -> dict:
    import torch
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    model, optimizer, data, m = hf_model(args)

    def step(i):
        rows = torch.arange(i * m["batch"], (i + 1) * m["batch"]) % data.shape[0]
        batch = data[rows]
        with record_function("hf_forward"), torch.autocast("cpu", torch.bfloat16, enabled=args.precision == "bfloat16"):
            logits = model(input_ids=batch[:, :-1]).logits
        with record_function("hf_loss"):
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, m["n_vocab"]),
                                                     batch[:, 1:].reshape(-1))
        with record_function("hf_backward"):
            loss.backward()
        with record_function("hf_clip"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with record_function("hf_optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    for i in range(args.warmup):
        step(i)
    walls = []
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for i in range(args.steps):
            start = time.perf_counter()
            step(args.warmup + i)
            walls.append(time.perf_counter() - start)
    totals, top = collections.Counter(), collections.Counter()
    for event in prof.events():
        phase, parent = "", event
        while parent is not None:
            if parent.name.startswith("hf_"):
                phase = parent.name
            parent = parent.cpu_parent
        if event.name.startswith("hf_"):
            continue
        category = torch_category(event.name, phase, event.input_shapes or [], m["n_vocab"], m["n_embd"])
        ms = event.self_cpu_time_total / 1e3
        totals[category] += ms
        top[(category, phase, event.name)] += ms
    return {"ms_per_step": {k: v / args.steps for k, v in totals.items()},
            "wall_ms": [round(1e3 * w, 1) for w in walls],
            "top": [[c, p, n, round(ms / args.steps, 1)] for (c, p, n), ms in top.most_common(args.top)]}


def hf_model(args):
    import torch
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    m = bench_train.model_args(args)
    torch.manual_seed(0)
    config = GPTNeoConfig(vocab_size=m["n_vocab"], max_position_embeddings=m["n_ctx"], hidden_size=m["n_embd"],
                          num_layers=m["n_layer"], num_heads=m["n_head"],
                          attention_types=[[["global", "local"], m["n_layer"] // 2]] if m["n_layer"] % 2 == 0 else
                          [[["global"], m["n_layer"]]], window_size=m["window"],
                          activation_function="gelu_new", resid_dropout=0.0, embed_dropout=0.0, attention_dropout=0.0)
    model = GPTNeoForCausalLM(config)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                  fused=True)
    data = torch.randint(0, m["n_vocab"], (64, m["n_ctx"] + 1), generator=torch.Generator().manual_seed(0))
    return model, optimizer, data, m


WORKERS = {"ours": worker_ours, "hf": worker_hf}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(bench_train.SHAPES), default="bench")
    for key in ("n_layer", "n_embd", "n_head", "n_vocab"):
        p.add_argument(f"--{key}", type=int, help="(default: the shape's)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=2, help="profiled steps (their mean is shown)")
    p.add_argument("--top", type=int, default=15, help="also list the N most expensive ops of each side")
    p.add_argument("--precision", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--skip_hf", action="store_true")
    p.add_argument("--sequential", action="store_true",
                   help="ours: run one op at a time (one inter-op thread; each op still uses every core), so that "
                        "op times are not inflated by ops running side by side and add up to the step's wall time")
    p.add_argument("--cpus", default="", help="run on these CPUs only, e.g. 0")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for key, value in bench_train.SHAPES[args.shape].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.worker:
        if args.cpus:
            os.sched_setaffinity(0, [int(c) for c in args.cpus.split(",")])
        print(MARK + json.dumps(WORKERS[args.worker](args)), flush=True)
        return 0
    if args.warmup < 1 or args.steps < 1:
        raise SystemExit("error: --warmup and --steps must be at least 1")

    results = {}
    for kind in ["ours"] + ([] if args.skip_hf else ["hf"]):
        command = [sys.executable, os.path.abspath(__file__), "--worker", kind]
        for key in ("shape", "n_layer", "n_embd", "n_head", "n_vocab", "warmup", "steps", "top", "precision", "cpus"):
            command += [f"--{key}", str(getattr(args, key))]
        command += ["--sequential"] if args.sequential else []
        run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        lines = [l for l in run.stdout.splitlines() if l.startswith(MARK)]
        if run.returncode or not lines:
            raise SystemExit(f"error: the {kind} worker failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}")
        results[kind] = json.loads(lines[-1][len(MARK):])
        print(json.dumps(dict(results[kind], measure=kind, load=[round(x, 2) for x in os.getloadavg()])), flush=True)

    print(f"\nshape {args.shape}: {args.n_layer} layers x {args.n_embd} wide, ctx {args.n_ctx}, batch {args.batch}, "
          f"window {args.window}, {args.precision}; mean of {args.steps} profiled steps after {args.warmup} warm-up")
    sides = list(results)
    print(f"{'op time per step':<44}" + "".join(f"{s + ' ms':>12}{'share':>8}" for s in sides))
    sums = {s: sum(results[s]["ms_per_step"].values()) or 1.0 for s in sides}
    for category in CATEGORIES:
        print(f"{category:<44}" + "".join(f"{results[s]['ms_per_step'].get(category, 0.0):>12.1f}"
                                          f"{100 * results[s]['ms_per_step'].get(category, 0.0) / sums[s]:>7.1f}%"
                                          for s in sides))
    print(f"{'sum of op times':<44}" + "".join(f"{sums[s]:>12.1f}{'':>8}" for s in sides))
    print(f"{'wall time per step (profiled)':<44}" + "".join(
        f"{sum(results[s]['wall_ms']) / len(results[s]['wall_ms']):>12.1f}{'':>8}" for s in sides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
