"""Benchmark the data tools against what training consumes, on this machine, in one run.

    .venv/bin/python bench/bench_data.py                 # about 2 minutes on 2 busy cores
    .venv/bin/python bench/bench_data.py --train_steps 50 --repeats 3

1. Tokenization: data/create_tfrecords.py on this Python's standard library (the quickstart's data:
   top-level ``*.py``, --minimum_size 64, --files_per 40) into a temporary folder, with 1 process and
   with --processes 2: input MB/s and tokens/s, in all and per process.
2. Input pipeline: ``train_dataset`` with configs/default.json's settings (n_ctx, train_batch_size,
   the stitch and sampling mode of its dataset, seed, n_vocab) on that data: sequences/s read from
   the pipeline (after the first batch); also the time to start at a far-away step (an exact resume)
   and the eval pipeline's rate.
3. Training: configs/default.json trained with the project's runner (train.loop.train,
   one CPU device, the same input pipeline) into a temporary model_path for --train_steps steps; the
   first --warmup steps (graph building, allocator warm-up) are not timed. Sequences/s consumed =
   train_batch_size x timed steps / seconds.

Then the ratio pipeline / training with a PASS/FAIL line against the target (pipeline >= 10x what
training consumes) and the machine's load average, since other processes share the cores. One JSON
object per measurement on stdout, then a summary. Exit code 1 on FAIL. Nothing in the repository changes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
if __name__ == "__main__":  # the benchmark and its worker processes: TF's C++ chatter off the console
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()
warnings.filterwarnings("ignore")  # mesh-tensorflow's deprecation notices

import models  # noqa: E402,F401  (the mesh-tensorflow import alias)
from devices.placement import configure  # noqa: E402

DEVICES = configure(["device:CPU:0"])  # before TensorFlow starts: training runs on one CPU device

import tensorflow.compat.v1 as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")

from data.create_tfrecords import create_tfrecords  # noqa: E402
from data.documents import list_input_files  # noqa: E402
from data.inputs import DatasetSource, eval_dataset, train_dataset  # noqa: E402
from config import load_config, replace  # noqa: E402

TOKENIZER = os.path.join(ROOT, "data", "tokenizers", "stdlib-bpe-4096.json")
TARGET_RATIO = 10.0


def report(**fields) -> dict:
    print(json.dumps(fields), flush=True)
    return fields


def load() -> list:
    return [round(x, 2) for x in os.getloadavg()]


def tokenize(stdlib: str, output_dir: str, processes: int) -> tuple:
    started = time.perf_counter()
    summary = create_tfrecords(stdlib, output_dir, "stdlib", encoder_path=TOKENIZER, minimum_size=64, files_per=40,
                               glob="*.py", processes=processes, show_progress=False)
    return summary, time.perf_counter() - started


def sequences_per_second(dataset, batch_size: int, seconds: float) -> tuple:
    """(seconds to the first batch, sequences/s over at least ``seconds`` after it)."""
    iterator = iter(dataset)
    started = time.perf_counter()
    next(iterator)
    first = time.perf_counter() - started
    batches, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        try:
            next(iterator)
        except StopIteration:
            break
        batches += 1
    return first, batches * batch_size / (time.perf_counter() - started)


def training_sequences_per_second(cfg, path: str, model_path: str, steps: int, warmup: int) -> dict:
    """Train ``cfg`` for ``steps`` steps with the project's runner and input pipeline; time the steps after
    ``warmup``."""
    from execution.callbacks import EachStep
    from train import loop
    from devices.placement import Placement

    use = cfg.datasets[0]
    cfg = replace(cfg, model_path=model_path, train_steps=steps, steps_per_checkpoint=steps)
    times, losses = [], []

    def clock(step, values):
        times.append(time.perf_counter())
        losses.append(float(values["loss"]))

    def batches(start_step):
        return train_dataset([DatasetSource(path, use.stitch, use.sampling_mode)], cfg.n_ctx, cfg.train_batch_size,
                             cfg.seed, start_step=start_step, n_vocab=cfg.n_vocab)

    loop.train(cfg, Placement(tuple(DEVICES)), batches, [EachStep(clock)])
    seconds = times[-1] - times[warmup - 1]
    timed = len(times) - warmup
    return {"steps_per_s": timed / seconds, "sequences_per_s": timed * cfg.train_batch_size / seconds,
            "first_loss": losses[0], "last_loss": losses[-1]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="model config whose settings the pipeline and training use")
    parser.add_argument("--train_steps", type=int, default=30, help="training steps, warm-up included")
    parser.add_argument("--warmup", type=int, default=5, help="first training steps not timed")
    parser.add_argument("--pipeline_seconds", type=float, default=5.0, help="how long to read the pipeline")
    parser.add_argument("--repeats", type=int, default=2, help="measure tokenization and the pipeline N times; keep the best (the machine is shared)")
    parser.add_argument("--resume_step", type=int, default=100_000)
    args = parser.parse_args(argv)
    if not 0 < args.warmup < args.train_steps:
        parser.error("need 0 < --warmup < --train_steps")

    cfg = load_config(args.model)
    use = cfg.datasets[0]
    stdlib = sysconfig.get_path("stdlib")
    megabytes = sum(os.path.getsize(path) for path in list_input_files(stdlib, "*.py")) / 1e6
    report(measure="machine", cpus=os.cpu_count(), load_average_1_5_15min=load())
    results: dict = {}

    with tempfile.TemporaryDirectory() as folder:
        # 1. tokenization
        for processes in (1, 2):
            best = None
            for repeat in range(args.repeats):
                summary, seconds = tokenize(stdlib, os.path.join(folder, f"p{processes}_{repeat}"), processes)
                best = seconds if best is None else min(best, seconds)
            results[processes] = report(
                measure="create_tfrecords", processes=processes, documents=summary.documents_read, input_mb=round(megabytes, 2),
                tokens=summary.tokens_written, seconds=round(best, 2), mb_per_s=round(megabytes / best, 2),
                tokens_per_s=round(summary.tokens_written / best), mb_per_s_per_process=round(megabytes / best / processes, 2),
                tokens_per_s_per_process=round(summary.tokens_written / best / processes), load=load())
        path = os.path.join(folder, "p1_0", "stdlib_*.tfrecords")

        # 2. input pipeline, with the model config's settings
        settings = dict(n_ctx=cfg.n_ctx, batch_size=cfg.train_batch_size, stitch=use.stitch, sampling_mode=use.sampling_mode)
        rates = []
        for _ in range(args.repeats):
            dataset = train_dataset([DatasetSource(path, use.stitch, use.sampling_mode)], cfg.n_ctx, cfg.train_batch_size,
                                    cfg.seed, n_vocab=cfg.n_vocab)
            first, rate = sequences_per_second(dataset, cfg.train_batch_size, args.pipeline_seconds)
            rates.append(rate)
        pipeline = report(measure="train_dataset", **settings, first_batch_s=round(first, 3),
                          sequences_per_s=round(max(rates)), tokens_per_s=round(max(rates) * cfg.n_ctx), load=load())
        started = time.perf_counter()
        next(iter(train_dataset([DatasetSource(path, use.stitch, use.sampling_mode)], cfg.n_ctx, cfg.train_batch_size,
                                cfg.seed, start_step=args.resume_step, n_vocab=cfg.n_vocab)))
        report(measure="train_dataset resume", start_step=args.resume_step, build_and_first_batch_s=round(time.perf_counter() - started, 3))
        first, rate = sequences_per_second(eval_dataset(path, cfg.n_ctx, cfg.eval_batch_size, n_vocab=cfg.n_vocab),
                                           cfg.eval_batch_size, args.pipeline_seconds)
        report(measure="eval_dataset", n_ctx=cfg.n_ctx, batch_size=cfg.eval_batch_size, sequences_per_s=round(rate))

        # 3. what training consumes
        training = report(measure="training", model=args.model, steps=args.train_steps, timed_steps=args.train_steps - args.warmup,
                          **{k: round(v, 3) for k, v in training_sequences_per_second(
                              cfg, path, os.path.join(folder, "run"), args.train_steps, args.warmup).items()},
                          load=load())

    ratio = pipeline["sequences_per_s"] / training["sequences_per_s"]
    verdict = "PASS" if ratio >= TARGET_RATIO else "FAIL"
    print()
    print(f"machine: {os.cpu_count()} CPUs, load average {' / '.join(map(str, load()))} (1/5/15 min) at the end")
    for processes in (1, 2):
        r = results[processes]
        how = "1 process (tokenizers' Rust threads on)" if processes == 1 else f"--processes {processes} (1 thread each)  "
        print(f"tokenization, {how}: {r['mb_per_s']:5.2f} MB/s, "
              f"{r['tokens_per_s']:>9,} tokens/s  ({r['mb_per_s_per_process']:.2f} MB/s, {r['tokens_per_s_per_process']:,} tokens/s "
              f"per process; {r['input_mb']} MB, {r['tokens']:,} tokens)")
    print(f"input pipeline ({use.sampling_mode}, stitch {use.stitch}, n_ctx {cfg.n_ctx}, batch {cfg.train_batch_size}): "
          f"{pipeline['sequences_per_s']:,} sequences/s")
    print(f"training {args.model} (1 CPU device, {training['steps_per_s']:.2f} steps/s): "
          f"{training['sequences_per_s']:,.1f} sequences/s consumed")
    print(f"{verdict}: the pipeline feeds {ratio:,.1f}x what training consumes (target >= {TARGET_RATIO:g}x)")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
