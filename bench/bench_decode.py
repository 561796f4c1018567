"""Decoding speed: this project's sampler (kv cache) against HF transformers' GPTNeoForCausalLM.generate.

    .venv/bin/python bench/bench_decode.py                       # prompts of 16, 256 and 1024 tokens (~5 minutes)
    .venv/bin/python bench/bench_decode.py --repeats 2 --prompt_lengths 16   # a quick check
    .venv/bin/python bench/bench_decode.py --prompt_lengths 16 1024 --new_tokens 8 40 --recompute
    .venv/bin/python bench/bench_decode.py --peers float32 bfloat16+compile --variants float32 bfloat16
    .venv/bin/python bench/bench_decode.py --auto_jit --kernels plain --skip_hf --prompt_lengths 16 256 --rounds 3

Same model in both (default: 6 layers, 512 wide, 8 heads, vocabulary 8192, context 2048, global/local with
GPT-Neo's 256-token window), batch 1, greedy. For each prompt length, each side generates N1 and then N2 new
tokens, --repeats times (default 5); each repeat's time per new token is (t(N2) - t(N1)) / (N2 - N1), which
leaves out the prompt's forward pass (prefill) and the fixed costs of a call, and the median over the repeats
is reported (a neighbour's burst moves one repeat, not the median), with the best (min t(N2) - min t(N1)) beside
it.

Decoding at batch 1 is bound by memory reads, so the bench also measures the machine's memory bandwidth (a
STREAM-like copy of 2 x 256 MB with NumPy, one thread per CPU, bytes read plus written; median and best of 7)
and reports each side's bandwidth utilisation: the bytes a decoder must read per new token (every weight once,
fp32: the blocks and the tied embedding for the logits; the key/value cache up to the position for global
layers, the window for local ones) divided by the time per token and by the copy's bandwidth. Ours runs models/sampling.py's in-graph loop (infer/outputs.py's PREDICT graph, one
session.run per call, the prompt length fed, so one graph serves every prompt length); it uses the kv cache
(models/kv_cache.py) where the model allows it (`models.attention.uses_cache`) and says which path it took.
--recompute also times the full-recompute path (every new token recomputes the whole context). Ours is the
whole generation compiled as one XLA program (models/compiled_decoding.py) where the model allows it (path
"compiled"); --mtf_loop also times the mtf sampler's loop it replaces (compiled_decoding false) and prints the ratio.
Every side runs in its own process, one after another.

HF runs as a PyTorch user on this CPU would pick (--peers): generate in eager mode and with the model's forward
under torch.compile (dynamic shapes: the cache grows every token; GPTNeo has no static cache, so generate does
not compile it by itself), each in float32 and, where the CPU has bf16 matrix units, with the weights in
bfloat16. Ours runs in what `precision: auto` runs a trained model in on this CPU (training's precision:
bfloat16 where the CPU has bf16 matrix units), and in float32 beside it (--variants). The headline is ours (the
first of --variants) / the best peer at each prompt length.

--auto_jit measures ours also under TensorFlow's XLA auto-clustering of the whole program (bench/worker.py's
JIT_MODES: auto_jit, and auto_jit+onednn with XLA:CPU's oneDNN matmuls), each mode in its own processes,
interleaved with the default over --rounds, and prints each mode's median per-token time over every repeat of
every round, its ratio to the default's, and the warm-up calls' seconds (--warmup; XLA's compiles, cold in the
first round unless XLA's compile cache held them). --kernels plain runs the model's fused kernels as plain TF
ops, as --predict does on CPUs (infer/job.py); the default, xla, is what the harness and training's programs run.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":  # the benchmark and its worker processes: TF's C++ chatter off the console
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()

import bench_train  # noqa: E402  (peer_name; nothing heavy at module level)
import worker  # noqa: E402

MARK = worker.MARK
PEERS = ["float32", "bfloat16", "float32+compile", "bfloat16+compile"]


def attention_types(n_layer: int) -> list:
    return [[["global", "local"], n_layer // 2]] if n_layer % 2 == 0 else [[["global"], n_layer]]


def worker_ours(args, names: list | None = None) -> dict:
    """This project's decoding speed on `names` (mesh devices; default one CPU device: bench_gpu.py passes a GPU),
    in args.precision where given (default float32)."""
    import numpy as np
    import models  # noqa: F401
    import tensorflow.compat.v1 as tf
    from devices.placement import Placement, configure
    from infer import run
    from models import attention, compiled_decoding, sampling
    from config import config_from_dict

    tf.get_logger().setLevel("ERROR")
    names = names or configure(["device:CPU:0"])
    cfg = config_from_dict(dict(precision=getattr(args, "precision", "float32"),
        n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head, n_ctx=args.n_ctx, n_vocab=args.n_vocab,
        attention_types=attention_types(args.n_layer), local_attention_radius=args.window, temperature=0.0,
        predict_batch_size=1, mesh_shape="all:1", layout="", kv_cache=not args.recompute_worker), "bench config")
    # prefill over the whole context (None), and with --prefill_bucket also over the prompt's bucket, as --predict
    # and the harness run it (models/sampling.prefill_bucket); one program per prefill
    prefills = {p: [None] + ([sampling.prefill_bucket(p, cfg.n_ctx)] if getattr(args, "prefill_bucket", False) else [])
                for p in args.prompt_lengths}
    sessions = {}
    path = None
    for prefill in sorted({b for bs in prefills.values() for b in bs}, key=lambda b: b or 0):
        options = sampling.SamplingOptions.from_config(cfg, max_new_tokens=args.new_tokens[0], stop_id=None,
                                                       temperature=0.0, prefill_length=prefill,
                                                       compiled=not getattr(args, "mtf_loop_worker", False))
        path = ("compiled" if compiled_decoding.unsupported(cfg, options) is None else "kv cache") \
            if attention.uses_cache(cfg, options) else "full recompute"
        # --predict's program (infer/run.Predictor's): the prompt length and the drawn options (greedy, the
        # number of new tokens) fed, one graph for every prompt and generation length
        placement = Placement(devices=tuple(names), kernels=getattr(args, "kernels", "xla"))
        drawn = options.draw_rows(1)
        rows = {"tokens": np.zeros([1, cfg.n_ctx], np.int32), "prompt_length": np.zeros([1], np.int32), **drawn}
        program = run.prediction_program(cfg, placement, rows, 1, options.program(drawn))
        session = program.open(None)
        fed = program.inputs.placeholders
        for new in args.new_tokens:
            draws = dataclasses.replace(options, max_new_tokens=new).draw_rows(1)
            sessions[prefill, new] = (session, program.lowered.outputs["tokens"], fed["tokens"], fed["prompt_length"],
                                      {fed[name]: value for name, value in draws.items()})

    rng = np.random.RandomState(0)
    results, first_call = {}, {}
    for p in args.prompt_lengths:
        row = np.zeros([1, cfg.n_ctx], np.int32)
        row[0, :p] = rng.randint(0, cfg.n_vocab, p)
        ours = [(prefill, new) for prefill in prefills[p] for new in args.new_tokens]
        outputs = {}
        for key in ours:
            session, fetch, tokens, length, draws = sessions[key]
            for call in range(args.warmup):  # XLA compiles here, if at all: auto-clustering over several calls
                start = time.perf_counter()
                outputs[key] = session.run(fetch, {tokens: row, length: [p], **draws})
                first_call.setdefault(f"{p}/{key[0]}/{key[1]}", []).append(round(time.perf_counter() - start, 3))
            assert (outputs[key][0, :p] == row[0, :p]).all()
        for prefill, new in ours:  # the bucket's prefill changes nothing but the time
            np.testing.assert_array_equal(outputs[prefill, new], outputs[None, new])
        times, cpu = {}, {}
        for _ in range(args.repeats):  # N1 and N2, and each prefill, interleaved: each repeat sees the same machine
            for key in ours:
                session, fetch, tokens, length, draws = sessions[key]
                start, start_cpu = time.perf_counter(), time.process_time()
                session.run(fetch, {tokens: row, length: [p], **draws})
                times.setdefault(key, []).append(time.perf_counter() - start)
                cpu.setdefault(key, []).append(time.process_time() - start_cpu)
        results[str(p)] = per_token({new: times[None, new] for new in args.new_tokens}, args.new_tokens,
                                    {new: cpu[None, new] for new in args.new_tokens})
        if getattr(args, "prefill_bucket", False):
            results[str(p)]["bucket"] = dict(prefill_length=prefills[p][1], **per_token(
                {new: times[prefills[p][1], new] for new in args.new_tokens}, args.new_tokens,
                {new: cpu[prefills[p][1], new] for new in args.new_tokens}))
        results[str(p)]["tokens"] = outputs[None, args.new_tokens[1]][0, p:p + args.new_tokens[1]].tolist()
    # the warm-up calls' seconds by "prompt/prefill/new tokens" (prefill None: the whole context)
    return {"path": path, "by_prompt": results, "first_call_s": first_call}


def per_token(times: dict, new_tokens, cpu: dict | None = None) -> dict:
    """Per-new-token ms from each repeat's t(N1) and t(N2): their median (the figure) and the best (min t(N2) -
    min t(N1)), and the median t(N1) (prefill and the first tokens); with `cpu` (the process's CPU seconds of each
    call), the median CPU seconds of a whole generation of N1 and of N2 tokens."""
    import statistics
    n1, n2 = new_tokens
    pairs = [(b - a) / (n2 - n1) for a, b in zip(times[n1], times[n2])]
    extra = {f"cpu_n{i + 1}_s": statistics.median(cpu[n]) for i, n in enumerate(new_tokens)} if cpu else {}
    return {**extra, "t_n1_s": statistics.median(times[n1]), "t_n2_s": statistics.median(times[n2]),
            "per_token_ms": 1e3 * statistics.median(pairs),
            "per_token_best_ms": 1e3 * (min(times[n2]) - min(times[n1])) / (n2 - n1),
            "per_token_repeats_ms": [round(1e3 * x, 2) for x in pairs]}


def worker_hf(args, device: str = "cpu") -> dict:
    """HF generate's decoding speed on the CPU or (bench_gpu.py) device "cuda", in args.precision where given
    (the weights in that dtype), the model's forward under torch.compile where args.compile."""
    import torch
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(0)
    if device == "cpu":
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    config = GPTNeoConfig(vocab_size=args.n_vocab, max_position_embeddings=args.n_ctx, hidden_size=args.n_embd,
                          num_layers=args.n_layer, num_heads=args.n_head, attention_types=attention_types(args.n_layer),
                          window_size=args.window, activation_function="gelu_new", resid_dropout=0.0,
                          embed_dropout=0.0, attention_dropout=0.0, bos_token_id=0, eos_token_id=0)
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(getattr(args, "precision", "float32"),
                                                                       torch.float32)
    model = GPTNeoForCausalLM(config).to(device=device, dtype=dtype).eval()
    if getattr(args, "compile", False):
        model.forward = torch.compile(model.forward, dynamic=True)
    generator = torch.Generator().manual_seed(0)
    results = {}
    for p in args.prompt_lengths:
        ids = torch.randint(1, args.n_vocab, (1, p), generator=generator).to(device)
        times, cpu = {}, {}

        def kwargs(new):
            return dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=0,
                        attention_mask=torch.ones_like(ids))
        with torch.no_grad():
            for new in args.new_tokens:
                out = model.generate(ids, **kwargs(new))  # warm-up
                assert out.shape[1] == p + new
            for _ in range(args.repeats):  # N1 and N2 interleaved, as ours
                for new in args.new_tokens:
                    start, start_cpu = time.perf_counter(), time.process_time()
                    model.generate(ids, **kwargs(new))
                    if device != "cpu":
                        torch.cuda.synchronize()
                    times.setdefault(new, []).append(time.perf_counter() - start)
                    cpu.setdefault(new, []).append(time.process_time() - start_cpu)
        results[str(p)] = per_token(times, args.new_tokens, cpu)
    return {"path": "DynamicCache", "by_prompt": results, "torch_threads": torch.get_num_threads()}


def copy_bandwidth(megabytes: int = 256, repeats: int = 7) -> dict:
    """Memory bandwidth of a STREAM-like copy: a `megabytes` float64 array copied into another (far beyond the
    caches) by one thread per CPU this process may use, each a contiguous slice (NumPy releases the GIL in the
    copy); bytes read plus written per second, the median and the best of `repeats` after one untimed copy."""
    import statistics
    from concurrent.futures import ThreadPoolExecutor
    import numpy as np

    n = megabytes * 2 ** 20 // 8
    src, dst = np.ones(n), np.zeros(n)
    threads = len(os.sched_getaffinity(0))
    bounds = np.linspace(0, n, threads + 1).astype(int)
    slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    rates = []
    with ThreadPoolExecutor(threads) as pool:
        def copy():
            list(pool.map(lambda s: np.copyto(dst[s], src[s]), slices))
        copy()
        for _ in range(repeats):
            start = time.perf_counter()
            copy()
            rates.append(2 * src.nbytes / (time.perf_counter() - start))
    return {"copy_bytes_per_s": statistics.median(rates), "copy_best_bytes_per_s": max(rates), "threads": threads,
            "array_mb": megabytes}


def worker_bandwidth(args) -> dict:
    return copy_bandwidth()


def bytes_per_token(args, position: float) -> float:
    """Bytes a decoder must read for one new token at `position` (fp32): every weight once (the blocks, the final
    LayerNorm and the tied embedding for the logits; one row of each embedding is negligible) and the key/value
    cache, up to the position for global layers and the window for local ones."""
    d = args.n_embd
    per_layer = (4 * d * d + d) + 2 * (2 * d) + (d * 4 * d + 4 * d) + (4 * d * d + d)  # models/flops.py's count
    weights = args.n_layer * per_layer + 2 * d + args.n_vocab * d
    kinds = [k for pair in [["global", "local"]] * (args.n_layer // 2) for k in pair] if args.n_layer % 2 == 0 \
        else ["global"] * args.n_layer
    keys = sum(position + 1 if k == "global" else min(args.window, position + 1) for k in kinds)
    return 4.0 * (weights + 2 * d * keys)


WORKERS = {"ours": worker_ours, "hf": worker_hf, "bandwidth": worker_bandwidth}


def run_worker(kind: str, args, recompute: bool = False, peer: bool = False, variant: str = "float32",
               jit: str = "default", mtf_loop: bool = False) -> dict:
    """One measurement in a fresh process: this checkout's worker, or (peer) the peer checkout's own worker
    under the peer's Python (its stack). `variant`: a precision, +compile for HF under torch.compile; `jit`: a
    mode of worker.JIT_MODES (ours: XLA auto-clustering)."""
    python, root = (args.peer_python, os.path.abspath(args.peer_repo)) if peer else (sys.executable, ROOT)
    precision, _, extra = variant.partition("+")
    command = [python, os.path.join(root, "bench", "bench_decode.py"), "--worker", kind]
    if variant != "float32":  # (a peer checkout's older bench may not know the flags)
        command += ["--precision", precision] + (["--compile"] if extra == "compile" else [])
    for key in ("n_layer", "n_embd", "n_head", "n_ctx", "n_vocab", "window", "repeats", "cpus") + \
            (("warmup",) if args.warmup != 1 else ()):  # (a peer's older bench may not know --warmup)
        command += [f"--{key}", str(getattr(args, key))]
    command += ["--prompt_lengths", *map(str, args.prompt_lengths), "--new_tokens", *map(str, args.new_tokens)]
    if recompute:
        command += ["--recompute_worker"]
    if mtf_loop:
        command += ["--mtf_loop_worker"]
    if getattr(args, "prefill_bucket", False) and kind == "ours" and not peer:
        command += ["--prefill_bucket"]
    if getattr(args, "kernels", "xla") != "xla" and kind == "ours" and not peer:
        command += ["--kernels", args.kernels]
    started = time.time()
    result = subprocess.run(command, capture_output=True, text=True, cwd=root, env=worker.jit_environment(jit))
    lines = [l for l in result.stdout.splitlines() if l.startswith(MARK)]
    if result.returncode != 0 or not lines:
        killed = " (killed by SIGKILL: out of memory? see dmesg)" if result.returncode == -9 else ""
        raise SystemExit(f"error: the {kind} worker failed with exit code {result.returncode}{killed}:\n"
                         f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    values = json.loads(lines[-1][len(MARK):])
    name = {"ours": "ours " + variant + ("" if jit == "default" else " " + jit),
            "hf": bench_train.peer_name(variant)}.get(kind, kind)
    values.update(measure=("peer " if peer else "") + name + (" recompute" if recompute else "")
                  + (" mtf loop" if mtf_loop else ""), variant=variant,
                  jit=jit,
                  wall_s=round(time.time() - started, 1),
                  load=[round(x, 2) for x in os.getloadavg()])
    print(json.dumps(values), flush=True)
    return values


def default_variants(flags) -> list:
    """Ours' precisions when --variants is not given: what `precision: auto` runs a trained model in on a CPU with
    these flags (the headline's), then float32 where that differs."""
    from devices import precision
    auto = precision.choose("auto", "CPU", flags).precision
    return [auto] + (["float32"] if auto != "float32" else [])


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n_layer", type=int, default=6)
    p.add_argument("--n_embd", type=int, default=512)
    p.add_argument("--n_head", type=int, default=8)
    p.add_argument("--n_ctx", type=int, default=2048)
    p.add_argument("--n_vocab", type=int, default=8192)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--prompt_lengths", type=int, nargs="+", default=[16, 256, 1024])
    p.add_argument("--new_tokens", type=int, nargs=2, default=[8, 40], metavar=("N1", "N2"),
                   help="two generation lengths; per-token time is the difference over N2 - N1")
    p.add_argument("--repeats", type=int, default=5, help="runs of each generation length; the median counts")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls of each program first (auto-clustering "
                   "compiles a cluster at its first call and again at a later one for each new shape)")
    p.add_argument("--recompute", action="store_true", help="also time this project's full-recompute path")
    p.add_argument("--mtf_loop", action="store_true", help="also time the mtf sampler's loop (compiled_decoding "
                   "false), in each of --variants")
    p.add_argument("--prefill_bucket", action="store_true",
                   help="also time ours with the prefill over the prompt's bucket (SamplingOptions.prefill_length, "
                        "as --predict runs it), interleaved with the whole context's prefill")
    p.add_argument("--variants", nargs="+", choices=["float32", "bfloat16"],
                   help="this project's precisions, the first the headline's (default: what `precision: auto` "
                        "runs a trained model in on this CPU, bfloat16 where it has bf16 matrix units, then float32)")
    p.add_argument("--peers", nargs="+", choices=PEERS,
                   help="HF's set-ups: the weights' dtype, +compile for the forward under torch.compile (default: "
                        "float32 and float32+compile, and their bfloat16 where the CPU has bf16 matrix units)")
    p.add_argument("--skip_hf", action="store_true")
    p.add_argument("--auto_jit", action="store_true",
                   help="also measure ours under XLA auto-clustering, and with XLA's oneDNN matmuls (bench/worker.py's "
                        "JIT_MODES), interleaved with the default over --rounds; prints the ratios")
    p.add_argument("--rounds", type=int, default=2, help="with --auto_jit: rounds of every mode, one after another")
    p.add_argument("--kernels", choices=["xla", "plain"], default="xla",
                   help="ours: the model's fused kernels XLA-compiled (the default) or as plain TF ops (--predict's "
                        "on CPUs)")
    p.add_argument("--cpus", default="", help="run every measurement on these CPUs only, e.g. 0 or 0,1 (default: "
                   "all); on a shared machine one pinned core is disturbed less than all cores")
    p.add_argument("--peer_python", help="also measure the peer checkout --peer_repo under this Python (its own "
                   "stack) and print ours / peer")
    p.add_argument("--peer_repo", help="the peer checkout, e.g. a worktree of an older commit")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--recompute_worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mtf_loop_worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--precision", default="float32", help=argparse.SUPPRESS)
    p.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def measure(args) -> dict:
    """Runs the measurements, printing one JSON line each; returns the summary the table prints."""
    if max(args.prompt_lengths) + max(args.new_tokens) > args.n_ctx:
        raise SystemExit(f"error: prompts of {max(args.prompt_lengths)} + {max(args.new_tokens)} new tokens do not fit "
                         f"n_ctx {args.n_ctx}")
    if bool(args.peer_python) != bool(args.peer_repo):
        raise SystemExit("error: --peer_python and --peer_repo go together")
    if args.repeats < 1:
        raise SystemExit(f"error: --repeats must be at least 1 (got {args.repeats})")
    if args.warmup < 1 or args.rounds < 1:
        raise SystemExit(f"error: --warmup and --rounds must be at least 1 (got {args.warmup} and {args.rounds})")
    from devices import precision
    cpu_name, flags = precision.cpu_info()
    if args.peers is None:
        args.peers = [p for p in PEERS if precision.units(flags) or not p.startswith("bfloat16")]
    if args.variants is None:
        args.variants = default_variants(flags)
    if args.skip_hf:
        args.peers = []
    cpu = precision.cpu_kind(cpu_name, flags)
    load_start = [round(x, 2) for x in os.getloadavg()]
    print(f"# {cpu}; {os.cpu_count()} CPUs{' (measuring on CPUs ' + args.cpus + ')' if args.cpus else ''}, load "
          f"average {load_start} at start; TF_ENABLE_ONEDNN_OPTS="
          f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', '(unset: TensorFlow decides by the CPU)')}", flush=True)
    bandwidth = [run_worker("bandwidth", args)]
    runs = [run_worker("ours", args, variant=v) for v in args.variants]
    jit_runs = {}
    if args.auto_jit:
        for round_ in range(args.rounds):  # every mode once a round: the machine's drift moves them all
            for mode in worker.JIT_MODES:
                run = runs[0] if round_ == 0 and mode == "default" else \
                    run_worker("ours", args, variant=args.variants[0], jit=mode)
                jit_runs.setdefault(mode, []).append(run)
    if args.peer_python:
        runs.append(run_worker("ours", args, peer=True))
    if args.recompute:
        runs.append(run_worker("ours", args, recompute=True))
    if args.mtf_loop:
        runs += [run_worker("ours", args, variant=v, mtf_loop=True) for v in args.variants]
    runs += [run_worker("hf", args, variant=v) for v in args.peers]
    bandwidth.append(run_worker("bandwidth", args))  # before and after: how much the machine moved meanwhile
    return dict(cpu=cpu, runs=runs, bandwidth=bandwidth, load_start=load_start,
                auto_jit=jit_summary(jit_runs, args.new_tokens),
                load_end=[round(x, 2) for x in os.getloadavg()], prompt_lengths=args.prompt_lengths,
                new_tokens=args.new_tokens, repeats=args.repeats,
                model={k: getattr(args, k) for k in ("n_layer", "n_embd", "n_head", "n_ctx", "n_vocab", "window")})


def jit_summary(jit_runs: dict, new_tokens) -> dict:
    """Per mode of --auto_jit and prompt: the median per-token ms over every repeat of every round, and the
    first calls' seconds of each round; whether its greedy tokens were the default's."""
    import statistics
    n1, n2 = new_tokens
    summary = {}
    for mode, runs in jit_runs.items():
        prompts = runs[0]["by_prompt"]
        summary[mode] = {p: dict(per_token_ms=statistics.median(x for r in runs for x in r["by_prompt"][p][
            "per_token_repeats_ms"]), rounds_ms=[round(r["by_prompt"][p]["per_token_ms"], 2) for r in runs],
            # CPU ms per token from each round's median CPU seconds of N1 and N2 tokens: what a loaded machine
            # stretches less than the wall time
            cpu_per_token_ms=statistics.median(1e3 * (r["by_prompt"][p]["cpu_n2_s"] - r["by_prompt"][p]["cpu_n1_s"])
                                               / (n2 - n1) for r in runs),
            same_tokens=all(r["by_prompt"][p]["tokens"] == jit_runs["default"][0]["by_prompt"][p]["tokens"]
                            for r in runs)) for p in prompts}
        summary[mode]["first_call_s"] = [r["first_call_s"] for r in runs]
    return summary


def ms(r: dict, p: int):
    """The median per-token time at prompt `p`, None where noise made it meaningless (t(N2) <= t(N1))."""
    value = r["by_prompt"][str(p)]["per_token_ms"]
    return value if value > 0 else None


def cpu_ms(r: dict, p: int, n1: int, n2: int) -> float:
    """The process's CPU ms per new token at prompt `p`, from the median CPU seconds of N1 and N2 tokens."""
    prompt = r["by_prompt"][str(p)]
    return 1e3 * (prompt["cpu_n2_s"] - prompt["cpu_n1_s"]) / (n2 - n1)


def cpu_ratio(ours: dict, peers: list, p: int, n1: int, n2: int) -> str:
    """The best peer's CPU ms a token over ours at prompt `p`, "-" where noise left no positive figure."""
    theirs = [cpu_ms(r, p, n1, n2) for r in peers if cpu_ms(r, p, n1, n2) > 0]
    mine = cpu_ms(ours, p, n1, n2)
    return f"{min(theirs) / mine:.2f}x" if theirs and mine > 0 else "-"


def best_peer(s: dict, p: int):
    """The peer run with the shortest per-token time at prompt `p` (None without peers)."""
    peers = [r for r in s["runs"] if r["measure"].startswith("HF") and ms(r, p)]
    return min(peers, key=lambda r: ms(r, p)) if peers else None


def print_table(s: dict, args) -> None:
    m, (n1, n2) = s["model"], s["new_tokens"]
    copy = max(b["copy_bytes_per_s"] for b in s["bandwidth"])
    print(f"\nmodel: {m['n_layer']} layers x {m['n_embd']} wide, {m['n_head']} heads, ctx {m['n_ctx']}, vocab "
          f"{m['n_vocab']}, global/local (window {m['window']}); batch 1, greedy; per-token = (t({n2}) - t({n1})) / "
          f"{n2 - n1}, median of {s['repeats']} (best in the JSON lines)")
    print(f"memory bandwidth (NumPy copy, {s['bandwidth'][0]['threads']} threads, read + write): median "
          f"{copy / 1e9:.1f} GB/s, best {max(b['copy_best_bytes_per_s'] for b in s['bandwidth']) / 1e9:.1f} GB/s "
          f"(medians before and after: {', '.join(format(b['copy_bytes_per_s'] / 1e9, '.1f') for b in s['bandwidth'])})")
    prompts = s["prompt_lengths"]
    print(f"{'':<40}" + "".join(f"{'prompt ' + str(p):>22}" for p in prompts))
    for r in s["runs"]:
        cells = "".join(f"{ms(r, p):>9.2f} ms ({1e3 / ms(r, p):>5.0f}/s)" if ms(r, p) else f"{'too noisy':>22}"
                        for p in prompts)
        print(f"{r['measure'] + ' [' + r['path'] + ']':<40}{cells}")
    needed = {p: bytes_per_token(SimpleNamespace(**m), p + (n1 + n2) / 2) for p in prompts}
    print(f"{'fp32 bytes to read per token (MB)':<40}" + "".join(f"{needed[p] / 1e6:>22.1f}" for p in prompts))
    for r in s["runs"]:
        cells = "".join(f"{100 * needed[p] / (ms(r, p) / 1e3) / copy:>21.0f}%" if ms(r, p) else f"{'-':>22}"
                        for p in prompts)
        print(f"{'bandwidth use (fp32 bytes), ' + r['measure']:<40}{cells}")
    for r in s["runs"]:  # the process's CPU per token: what a loaded machine stretches less than the wall time
        if all("cpu_n1_s" in r["by_prompt"][str(p)] for p in prompts):
            print(f"{'CPU ms a token, ' + r['measure']:<40}" + "".join(f"{cpu_ms(r, p, n1, n2):>22.2f}" for p in prompts))
    ours = s["runs"][0]
    cpu_peers = [r for r in s["runs"] if r["measure"].startswith("HF") and "cpu_n1_s" in r["by_prompt"][str(prompts[0])]]
    if cpu_peers and "cpu_n1_s" in ours["by_prompt"][str(prompts[0])]:
        print("CPU a token, best peer / ours: " + ", ".join(
            f"prompt {p}: {cpu_ratio(ours, cpu_peers, p, n1, n2)}" for p in prompts))
    if any("bucket" in ours["by_prompt"][str(p)] for p in prompts):
        print(f"whole generations of {n1} and {n2} new tokens (prefill included), ours, median wall / CPU seconds:")
        for p in prompts:
            whole, bucket = ours["by_prompt"][str(p)], ours["by_prompt"][str(p)]["bucket"]
            print(f"  prompt {p}: prefill {m['n_ctx']}: " + ", ".join(
                f"{whole[f't_n{i}_s']:.3f} / {whole[f'cpu_n{i}_s']:.3f} s" for i in (1, 2))
                + f"; prefill {bucket['prefill_length']}: " + ", ".join(
                f"{bucket[f't_n{i}_s']:.3f} / {bucket[f'cpu_n{i}_s']:.3f} s" for i in (1, 2))
                + f"; {n2} tokens {whole['t_n2_s'] / bucket['t_n2_s']:.2f}x faster (wall), "
                  f"{whole['cpu_n2_s'] / bucket['cpu_n2_s']:.2f}x less CPU")
    if any(best_peer(s, p) for p in prompts):
        print("decode tokens/s, ours / best peer: " + ", ".join(
            f"prompt {p}: " + (f"{ms(best_peer(s, p), p) / ms(ours, p):.2f}x ({best_peer(s, p)['measure']})"
                               if best_peer(s, p) and ms(ours, p) else "-") for p in prompts))
    mtf_loop = next((r for r in s["runs"] if r["measure"].endswith(" mtf loop")), None)
    if mtf_loop:  # the compiled generation against the mtf loop it replaces; CPU ms a token beside (load-proof)
        print("per token, ours / the mtf loop (compiled_decoding false), wall and CPU ms: " + ", ".join(
            f"prompt {p}: " + (f"{ms(mtf_loop, p) / ms(ours, p):.2f}x faster ({ms(ours, p):.2f} / {ms(mtf_loop, p):.2f}"
                               f" ms; CPU {cpu_ms(ours, p, n1, n2):.2f} / {cpu_ms(mtf_loop, p, n1, n2):.2f} ms)"
                               if ms(mtf_loop, p) and ms(ours, p) else "-") for p in prompts))
    peer = next((r for r in s["runs"] if r["measure"].startswith("peer ")), None)
    if peer:
        print(f"decode tokens/s, ours / peer ({args.peer_repo}): " + ", ".join(
            f"prompt {p}: " + (f"{ms(peer, p) / ms(ours, p):.2f}x" if ms(peer, p) and ms(ours, p) else "-")
            for p in prompts))
    if s.get("auto_jit"):
        jit = s["auto_jit"]
        print("XLA auto-clustering (--auto_jit): per-token ms, median over every repeat of every round (each "
              "round's median in brackets), / the default's; CPU ms per token (median over rounds), / the default's; "
              "warm-up calls' seconds per round")
        for mode, by_prompt in jit.items():
            cells = "; ".join(
                f"prompt {p}: {by_prompt[str(p)]['per_token_ms']:.2f} ms {by_prompt[str(p)]['rounds_ms']} "
                f"{by_prompt[str(p)]['per_token_ms'] / jit['default'][str(p)]['per_token_ms']:.2f}x"
                + f", CPU {by_prompt[str(p)]['cpu_per_token_ms']:.2f} ms "
                  f"{by_prompt[str(p)]['cpu_per_token_ms'] / jit['default'][str(p)]['cpu_per_token_ms']:.2f}x"
                + ("" if by_prompt[str(p)]["same_tokens"] else " OTHER TOKENS") for p in prompts)
            first = [round(sum(c[0] for c in calls.values()), 1) for calls in by_prompt["first_call_s"]]
            later = [round(sum(sum(c[1:]) for c in calls.values()), 1) for calls in by_prompt["first_call_s"]]
            print(f"  {mode:<16} {cells}; warm-up: first calls {first} s, later ones {later} s")
    if any(ms(r, p) is None for r in s["runs"] for p in prompts):
        print("# too noisy: the median t(N2) - t(N1) was not positive (other work on the machine); rerun with more "
              "--repeats or on pinned --cpus")
    print(f"# load average {s['load_end']} at end")


def main(argv=None) -> int:
    return worker.main(parse(argv), WORKERS, measure, print_table)


if __name__ == "__main__":
    sys.exit(main())
