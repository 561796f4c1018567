"""Benchmark the data tools: tfrecord creation throughput and input-pipeline speed.

    .venv/bin/python bench/bench_data.py [--n_ctx 256] [--batch_size 16] [--batches 200]

Builds the stdlib dataset into a temporary folder (so nothing in the repository changes),
then reports tokens/s of create_tfrecords, batches/s and tokens/s of train_dataset and
eval_dataset, and how long train_dataset takes to start at a far-away start_step (the
cost of an exact resume). One JSON object per measurement on stdout.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import sysconfig
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from data.create_tfrecords import create_tfrecords  # noqa: E402
from data.inputs import DatasetSource, eval_dataset, train_dataset  # noqa: E402

TOKENIZER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "tokenizers", "stdlib-bpe-4096.json")


def report(**fields) -> None:
    print(json.dumps(fields), flush=True)


def time_batches(dataset, batches: int) -> tuple:
    """Seconds to the first batch, then seconds for ``batches`` more."""
    iterator = iter(dataset)
    started = time.perf_counter()
    next(iterator)
    first = time.perf_counter() - started
    started = time.perf_counter()
    taken = 0
    for _ in range(batches):
        try:
            next(iterator)
        except StopIteration:
            break
        taken += 1
    return first, time.perf_counter() - started, taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n_ctx", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--stitch", type=int, default=4)
    parser.add_argument("--resume_step", type=int, default=100_000)
    args = parser.parse_args()
    stdlib = sysconfig.get_path("stdlib")

    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        summary = create_tfrecords(stdlib, os.path.join(folder, "train"), "stdlib", encoder_path=TOKENIZER, minimum_size=64,
                                   files_per=40, glob="*.py", show_progress=False)
        seconds = time.perf_counter() - started
        report(measure="create_tfrecords", documents=summary.documents_read, tokens=summary.tokens_written,
               seconds=round(seconds, 2), tokens_per_s=round(summary.tokens_written / seconds))
        path = os.path.join(folder, "train", "stdlib_*.tfrecords")
        tokens_per_batch = args.batch_size * args.n_ctx
        for mode in ("documents_random", "documents_fixed"):
            dataset = train_dataset([DatasetSource(path, args.stitch, mode)], args.n_ctx, args.batch_size, seed=0)
            first, seconds, taken = time_batches(dataset, args.batches)
            report(measure=f"train_dataset[{mode}]", first_batch_s=round(first, 3), batches_per_s=round(taken / seconds, 1),
                   tokens_per_s=round(taken * tokens_per_batch / seconds))
        started = time.perf_counter()
        dataset = train_dataset([DatasetSource(path, args.stitch, "documents_random")], args.n_ctx, args.batch_size, seed=0, start_step=args.resume_step)
        next(iter(dataset))
        report(measure="train_dataset resume", start_step=args.resume_step, build_and_first_batch_s=round(time.perf_counter() - started, 3))
        first, seconds, taken = time_batches(eval_dataset(path, args.n_ctx, args.batch_size), args.batches)
        report(measure="eval_dataset", first_batch_s=round(first, 3), batches_per_s=round(taken / seconds, 1),
               tokens_per_s=round(taken * tokens_per_batch / seconds), files=len(glob.glob(path)))


if __name__ == "__main__":
    main()
