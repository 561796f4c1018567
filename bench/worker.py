"""The benches' two halves in one script: run as a worker (`--worker KIND`), it measures one side in a process of
its own and prints one line, MARK + JSON, that the parent's run_worker reads; run without, it measures every side
and prints the table."""
from __future__ import annotations

import json
import os

MARK = "BENCH_RESULT "


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
