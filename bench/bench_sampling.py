"""Per-token cost of sampling, with the key/value cache and with full recompute, across prompt lengths.

    .venv/bin/python bench/bench_sampling.py [--n_ctx 512 --n_embd 256 --n_layer 4 --new_tokens 32 --repeats 3]

For each prompt length the sampler generates 1 and then `new_tokens` tokens (same graph, the limit is a
feature); the difference divided by new_tokens - 1 is the cost of one more token, prefill excluded. With the
cache it should stay flat as the prompt grows (each step is one token against a fixed-size cache); full
recompute runs the whole context every step. Prints milliseconds per token and ratios to the shortest prompt.
Timings on a shared machine are noisy: read the ratios, not single numbers.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if __name__ == "__main__":  # the benchmark and its worker processes: TF's C++ chatter off the console
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()

import models  # noqa: E402,F401
import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402

from infer import outputs  # noqa: E402
from execution import meshes  # noqa: E402
from devices.placement import Placement  # noqa: E402
from execution.mesh_session import MeshSession  # noqa: E402
from models import sampling  # noqa: E402
from config import config_from_dict  # noqa: E402


def build(cfg, options, batch):
    """The PREDICT graph for `batch` rows with the prompt and its length fed, at the seeded initial weights, in
    a session (execution/meshes.py, infer/outputs.py and execution/mesh_session.py)."""
    graph = tf.Graph()
    with graph.as_default():
        tokens = tf.placeholder(tf.int32, [batch, cfg.n_ctx])
        lengths = tf.placeholder(tf.int32, [batch])
        mesh, impl = meshes.placement_mesh(cfg, Placement(devices=("",)))
        features = {"tokens": tokens, "prompt_length": lengths, "seed": tf.zeros([batch], tf.int32)}
        lowered = outputs.predictions(cfg, mesh, impl, features, options)
    session = MeshSession(graph, lowered.lowering, "", tf.ConfigProto(), checkpoint=None)
    # (fetching only lengths would let TF prune the model)
    return session, tokens, lengths, lowered.outputs["tokens"]


def seconds(session, fetch, feeds, repeats):
    session.run(fetch, feeds)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(fetch, feeds)
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n_ctx", type=int, default=512)
    p.add_argument("--n_embd", type=int, default=256)
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--new_tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompts", type=int, nargs="+", default=None, help="prompt lengths (default: 4 up to n_ctx/2)")
    args = p.parse_args(argv)
    cfg = config_from_dict(dict(n_layer=args.n_layer, n_embd=args.n_embd, n_head=max(1, args.n_embd // 64),
                                n_vocab=args.n_vocab, n_ctx=args.n_ctx, local_attention_radius=64,
                                attention_types=[[["global", "local"], args.n_layer // 2]] if args.n_layer % 2 == 0
                                else [[["global"], args.n_layer]]), "bench")
    prompts = args.prompts or [4, args.n_ctx // 8, args.n_ctx // 4, args.n_ctx // 2]
    prompts = [p for p in prompts if p + args.new_tokens <= args.n_ctx]
    print(f"model: {cfg.n_layer} layers x {cfg.n_embd}, n_ctx {cfg.n_ctx}, vocab {cfg.n_vocab}, batch {args.batch}; "
          f"{args.new_tokens} new tokens; best of {args.repeats}")
    per_token = {}
    for incremental in (True, False):
        name = "kv cache" if incremental else "full recompute"
        runs = {}
        for new in (1, args.new_tokens):
            options = sampling.SamplingOptions(max_new_tokens=new, temperature=0.0, incremental=incremental)
            runs[new] = build(cfg, options, args.batch)
        costs = []
        for length in prompts:
            tokens = np.random.RandomState(0).randint(0, cfg.n_vocab, [args.batch, cfg.n_ctx]).astype(np.int32)
            feeds = lambda run: {run[1]: tokens, run[2]: np.full([args.batch], length, np.int32)}  # noqa
            one = seconds(runs[1][0], runs[1][3], feeds(runs[1]), args.repeats)
            many = seconds(runs[args.new_tokens][0], runs[args.new_tokens][3], feeds(runs[args.new_tokens]),
                           args.repeats)
            costs.append(max(many - one, 1e-9) / (args.new_tokens - 1))
            print(f"{name:>15} | prompt {length:>5} | first token (prefill) {1000 * one:8.2f} ms | "
                  f"per further token {1000 * costs[-1]:8.3f} ms", flush=True)
        for run in runs.values():
            run[0].close()
        per_token[name] = costs
        print(f"{name:>15} | per-token cost vs prompt {prompts[0]}: " +
              ", ".join(f"{p}: {c / costs[0]:.2f}x" for p, c in zip(prompts, costs)))
    speedup = [f / c for f, c in zip(per_token["full recompute"], per_token["kv cache"])]
    print("kv cache speed-up per token: " + ", ".join(f"prompt {p}: {s:.1f}x" for p, s in zip(prompts, speedup)))


if __name__ == "__main__":
    main()
