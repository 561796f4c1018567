"""GPU speed: this project against HF transformers' GPTNeoForCausalLM (PyTorch), same model, same GPU.

    python bench/bench_gpu.py                                  # fp32 and bf16 training, then decoding
    python bench/bench_gpu.py --precisions bfloat16 --skip_decode
    python bench/bench_gpu.py --dtype float16                     # GPUs without bfloat16 tensor cores
    python bench/bench_gpu.py --n_layer 24 --n_embd 1024 --n_head 16     # GPT-Neo 350M's shape

Training (default: GPT-Neo 125M's shape: 12 layers, 768 wide, 12 heads, vocabulary 50257, context 1024, batch 8,
global/local attention alternating with a 256-token window, Adam, gradient clipping 1.0): --warmup untimed steps,
then --steps timed ones, in this project (train/loop.py on a one-GPU mesh, device:GPU:0, through
bench_train.py's worker) and in HF's GPTNeo with torch.optim.AdamW on cuda (bench_train.py's worker, autocast
for bf16). Reports tokens/s, model FLOP/s per GPU (models/flops.py), MFU against the GPU's peak in that dtype
(devices/peaks.py: NVIDIA's datasheet for the GPUs it knows, else a measured matmul peak) and ours / HF.
float32 matmuls run as TF32 on both sides by default (TensorFlow's default on Ampere and newer; PyTorch's is off,
so this bench turns it on there): --tf32 off runs both in full fp32.

Decoding (bench_decode.py's method and workers): batch 1, greedy, ms per new token as (t(N2) - t(N1)) / (N2 - N1)
for each prompt length, ours (the kv cache sampler) against HF generate, in each precision.

Every measurement runs in its own process, one after another (bench_train.py's pattern); each prints one JSON
object, then a table. Exits with one `error:` line where TensorFlow sees no GPU. HF's side needs a CUDA build of
PyTorch in a venv of its own (`python3 -m venv .venv-hf && .venv-hf/bin/pip install -r requirements-gpu-hf.txt`, then
`--hf_python .venv-hf/bin/python`); without it HF is skipped with a line saying so (which CUDA the PyTorch found
was built for, and the driver's version).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
if __name__ == "__main__":  # the benchmark and its worker processes: TF's C++ chatter off the console
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()

import bench_decode  # noqa: E402  (their workers, with a device; nothing heavy is imported at module level)
import bench_train  # noqa: E402

MARK = "BENCH_RESULT "


# ---------------------------------------------------------------------------------------------------------
# Workers: each runs in its own process and prints one MARK line.


def _tensorflow_on_gpu(spec) -> tuple[list, str, str]:
    """Configures device:GPU:0 (memory growth), TF32 as asked, runs the start-up probe; returns (mesh device
    names, the start-up line, the fused kernels' path)."""
    import io
    import models  # noqa: F401
    import tensorflow as tf
    from devices import gpus
    from devices.placement import local_placement

    tf.get_logger().setLevel("ERROR")
    tf.config.experimental.enable_tensor_float_32_execution(spec.tf32 == "on")
    placement = local_placement(["device:GPU:0"], "growth")
    line = io.StringIO()
    placement, _ = gpus.start_up(placement, placement.session_config(), out=line)
    return list(placement.devices), line.getvalue().strip(), placement.kernels


def _torch_on_gpu(spec):
    """(torch, None) with CUDA ready, or (None, what PyTorch is: the parent turns it into the skip line). The HF
    workers may run in a venv without TensorFlow (--hf_python): they import only PyTorch and transformers."""
    os.environ.setdefault("USE_TF", "0")  # transformers must not import TensorFlow into this process
    import torch
    if not torch.cuda.is_available():
        return None, {"torch": torch.__version__, "cuda": torch.version.cuda}
    torch.backends.cuda.matmul.allow_tf32 = spec.tf32 == "on"
    torch.backends.cudnn.allow_tf32 = spec.tf32 == "on"
    return torch, None


def worker_peak(spec) -> dict:
    from devices.placement import Placement
    names, line, _ = _tensorflow_on_gpu(spec)
    placement = Placement(tuple(names))
    result = {"start_up": line}
    for precision in spec.precisions:
        peak = placement.peak(precision)
        result[precision] = {"flops": peak.flops, "source": peak.source}
    return result


def worker_ours_train(spec) -> dict:
    names, line, kernels = _tensorflow_on_gpu(spec)
    result = bench_train.worker_ours(SimpleNamespace(**vars(spec), xla=False, kernels=kernels), names)
    return dict(result, start_up=line, kernels=kernels)


def worker_hf_train(spec) -> dict:
    torch, missing = _torch_on_gpu(spec)
    if missing:
        return {"skipped": missing}
    result = bench_train.worker_hf(spec, device="cuda")
    return dict(result, gpu=torch.cuda.get_device_name(0), torch=torch.__version__)


def _decode_args(spec) -> SimpleNamespace:
    return SimpleNamespace(n_layer=spec.n_layer, n_embd=spec.n_embd, n_head=spec.n_head, n_ctx=spec.decode_ctx,
                           n_vocab=spec.n_vocab, window=spec.window, prompt_lengths=spec.prompt_lengths,
                           new_tokens=spec.new_tokens, repeats=spec.repeats, recompute_worker=False,
                           precision=spec.precision)


def worker_ours_decode(spec) -> dict:
    names, line, kernels = _tensorflow_on_gpu(spec)
    return dict(bench_decode.worker_ours(SimpleNamespace(**vars(_decode_args(spec)), kernels=kernels), names),
                kernels=kernels)


def worker_hf_decode(spec) -> dict:
    _, missing = _torch_on_gpu(spec)
    if missing:
        return {"skipped": missing}
    return bench_decode.worker_hf(_decode_args(spec), device="cuda")


WORKERS = {"peak": worker_peak, "ours_train": worker_ours_train, "hf_train": worker_hf_train,
           "ours_decode": worker_ours_decode, "hf_decode": worker_hf_decode}


# ---------------------------------------------------------------------------------------------------------
# Driver


def no_gpu_reason():
    """None where TensorFlow sees a GPU, else devices/gpus.py's line on what is missing."""
    from devices import gpus
    return gpus.no_gpu_reason(gpus.gather_facts())


def run_worker(kind: str, args, precision: str = "float32") -> dict:
    """One measurement in a fresh process (its GPU memory is freed when it ends); HF's under --hf_python."""
    spec = dict(vars(args), precision=precision)
    python = (getattr(args, "hf_python", None) or sys.executable) if kind.startswith("hf_") else sys.executable
    command = [python, os.path.abspath(__file__), "--worker", kind, "--spec", json.dumps(spec)]
    started = time.time()
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in result.stdout.splitlines() if line.startswith(MARK)]
    if result.returncode != 0 or not lines:
        raise SystemExit(f"error: the {kind} worker ({precision}) failed:\n{result.stdout[-2000:]}\n"
                         f"{result.stderr[-4000:]}")
    values = json.loads(lines[-1][len(MARK):])
    if isinstance(values.get("skipped"), dict):  # PyTorch without a usable GPU: its CUDA build and the driver
        from devices.gpus import driver_version, torch_cuda_problem
        values["skipped"] = torch_cuda_problem(values["skipped"]["torch"], values["skipped"]["cuda"], driver_version())
    values.update(measure=kind, precision=precision, wall_s=round(time.time() - started, 1))
    print(json.dumps(values), flush=True)
    return values


def training_table(args, peaks: dict, ours: dict, hf: dict) -> list[str]:
    lines = [f"{'training':<22}{'tokens/s':>10}{'s/step':>9}{'TFLOP/s':>10}{'MFU':>8}{'ours/HF':>9}"]
    for precision in args.precisions:
        o, h = ours[precision], hf.get(precision)
        peak = peaks[precision]["flops"]
        for who, r in (("ours", o), ("HF GPTNeo", h)):
            if not r or "skipped" in r:
                lines.append(f"{who + ' ' + precision:<22}  skipped: {r['skipped'] if r else 'not run'}")
                continue
            flops = r["tokens_per_s"] * o["flops_per_token"]
            mfu = f"{100 * flops / peak:.1f}%" if peak else "-"
            ratio = (f"{o['tokens_per_s'] / h['tokens_per_s']:.2f}x" if who == "ours" and h and "skipped" not in h
                     else "")
            lines.append(f"{who + ' ' + precision:<22}{r['tokens_per_s']:>10,.0f}{r['step_s']:>9.3f}"
                         f"{flops / 1e12:>10.1f}{mfu:>8}{ratio:>9}")
    for precision in args.precisions:
        lines.append(f"peak {precision}: {peaks[precision]['flops'] / 1e12:.1f} TFLOP/s per GPU "
                     f"({peaks[precision]['source']})")
    return lines


def decoding_table(args, ours: dict, hf: dict) -> list[str]:
    n1, n2 = args.new_tokens
    lines = [f"decoding: batch 1, greedy, ms per new token = (t({n2}) - t({n1})) / {n2 - n1}, median of {args.repeats}; "
             f"context {args.decode_ctx}",
             f"{'':<30}" + "".join(f"{'prompt ' + str(p):>16}" for p in args.prompt_lengths)]
    for precision in args.precisions:
        for who, r in (("ours", ours[precision]), ("HF generate", hf.get(precision))):
            if not r or "skipped" in r:
                lines.append(f"{who + ' ' + precision:<30}  skipped: {r['skipped'] if r else 'not run'}")
                continue
            cells = "".join(f"{r['by_prompt'][str(p)]['per_token_ms']:>13.2f} ms" for p in args.prompt_lengths)
            label = f"{who} {precision}" + (f" [{r['path']}]" if who == "ours" else "")
            lines.append(f"{label:<30}{cells}")
        h = hf.get(precision)
        if h and "skipped" not in h:
            o = ours[precision]["by_prompt"]
            ratios = ", ".join(f"prompt {p}: {h['by_prompt'][str(p)]['per_token_ms'] / o[str(p)]['per_token_ms']:.2f}x"
                               for p in args.prompt_lengths)
            lines.append(f"decode tokens/s {precision}, ours / HF: {ratios}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n_layer", type=int, default=12)
    p.add_argument("--n_embd", type=int, default=768)
    p.add_argument("--n_head", type=int, default=12)
    p.add_argument("--n_ctx", type=int, default=1024, help="training context")
    p.add_argument("--n_vocab", type=int, default=50257)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--window", type=int, default=256, help="local attention window (HF's window_size)")
    p.add_argument("--warmup", type=int, default=5, help="untimed training steps first (graph build, XLA compiles)")
    p.add_argument("--steps", type=int, default=20, help="timed training steps")
    p.add_argument("--precisions", "--dtype", nargs="+", default=["float32", "bfloat16"],
                   choices=["float32", "bfloat16", "float16"],
                   help="dtypes to measure, both sides (float16: V100, T4 and other GPUs without bfloat16 tensor "
                        "cores; HF with autocast and a GradScaler, ours with its dynamic loss scale)")
    p.add_argument("--tf32", choices=["on", "off"], default="on", help="float32 matmuls as TF32 on both sides")
    p.add_argument("--skip_hf", action="store_true", help="only this project")
    p.add_argument("--hf_python", help="the Python of a venv with requirements-gpu-hf.txt (a CUDA 12 PyTorch cannot "
                   "share TensorFlow's venv) for the HF side; default this Python")
    p.add_argument("--skip_decode", action="store_true")
    p.add_argument("--decode_ctx", type=int, default=2048, help="decoding's context (n_ctx of the decoding model)")
    p.add_argument("--prompt_lengths", type=int, nargs="+", default=[16, 256, 1024])
    p.add_argument("--new_tokens", type=int, nargs=2, default=[8, 40], metavar=("N1", "N2"))
    p.add_argument("--repeats", type=int, default=3, help="decoding: best of this many runs per length")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        print(MARK + json.dumps(WORKERS[args.worker](SimpleNamespace(**json.loads(args.spec)))), flush=True)
        return 0
    reason = no_gpu_reason()
    if reason:
        print(f"error: bench_gpu.py measures on a GPU: {reason}", file=sys.stderr)
        return 1
    if max(args.prompt_lengths) + max(args.new_tokens) > args.decode_ctx:
        raise SystemExit(f"error: prompts of {max(args.prompt_lengths)} + {max(args.new_tokens)} new tokens do not "
                         f"fit --decode_ctx {args.decode_ctx}")

    peaks = run_worker("peak", args)
    ours, hf, ours_decode, hf_decode = {}, {}, {}, {}
    for precision in args.precisions:
        ours[precision] = run_worker("ours_train", args, precision)
        if not args.skip_hf:
            hf[precision] = run_worker("hf_train", args, precision)
    if not args.skip_decode:
        for precision in args.precisions:
            ours_decode[precision] = run_worker("ours_decode", args, precision)
            if not args.skip_hf:
                hf_decode[precision] = run_worker("hf_decode", args, precision)

    print(f"\n{peaks['start_up']}")
    print(f"model: {args.n_layer} layers x {args.n_embd} wide, {args.n_head} heads, ctx {args.n_ctx}, vocab "
          f"{args.n_vocab}, batch {args.batch}, global/local (window {args.window}); {args.warmup} warm-up + "
          f"{args.steps} timed steps; TF32 {args.tf32}; fused kernels: "
          f"{', '.join(sorted({r['kernels'] for r in ours.values()}))}")
    for line in training_table(args, peaks, ours, hf):
        print(line)
    if not args.skip_decode:
        for line in decoding_table(args, ours_decode, hf_decode):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
