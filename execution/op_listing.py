"""Where a step's ops ran: the first training step (and --selfcheck's) is run once with its partition graphs
returned, and the ops placed on a GPU that ran on the CPU (soft placement moves ops without a GPU kernel for
their type and dtype) are listed in one line (`run_listing_placement`, `describe_placement`); a training run asks
for it with the `PlacementListing` callback."""
from __future__ import annotations

import io
import re
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from execution.callbacks import Callback, Run

@dataclass(frozen=True)
class Fallback:
    name: str
    op_type: str
    requested: str
    placed: str


def _kind(device: str) -> str:
    match = re.search(r"(?:^|/)(?:device:)?([A-Za-z_]+):\d+$", device or "")
    return match.group(1).upper() if match else ""


def cpu_fallbacks(ops: Iterable[tuple]) -> list[Fallback]:
    """The ops requested on a GPU that ran on a CPU, from (name, op type, requested device, placed device) of
    each op (requested: the graph's; placed: where the session ran it). Ops requested nowhere are left out (the
    input pipeline's, the global step's: the placer chooses for those)."""
    return [Fallback(name, op_type, requested, placed) for name, op_type, requested, placed in ops
            if _kind(requested) == "GPU" and _kind(placed) == "CPU"]


def placed_ops(graph, run_metadata) -> list[tuple]:
    """(name, op type, requested device, placed device) of every op of `graph` that a run with
    RunOptions(output_partition_graphs=True) placed (ops the session's optimisers renamed or added are left
    out: they have no requested device to compare)."""
    placed = {}
    for partition in run_metadata.partition_graphs:
        for node in partition.node:
            placed.setdefault(node.name, (node.op, node.device))
    ops = []
    for op in graph.get_operations():
        if op.name in placed:
            op_type, device = placed[op.name]
            ops.append((op.name, op_type, op.device, device))
    return ops


@dataclass(frozen=True)
class PlacementReport:
    ops: list          # (name, op type, requested, placed) of each placed op
    fallbacks: list    # the Fallbacks among them


def describe_placement(report: PlacementReport, limit: int = 6) -> str:
    """One line: every op placed on a GPU ran there, or which fell back to the CPU, grouped by op type."""
    requested_gpu = sum(_kind(requested) == "GPU" for _, _, requested, _ in report.ops)
    if not report.fallbacks:
        return f"placement: all {requested_gpu} ops of the training step placed on GPUs ran there"
    groups: "OrderedDict[str, list]" = OrderedDict()
    for f in report.fallbacks:
        groups.setdefault(f.op_type, []).append(f.name)
    shown = []
    for op_type, names in list(groups.items())[:limit]:
        examples = ", ".join(names[:2]) + (", ..." if len(names) > 2 else "")
        shown.append(f"{op_type} x{len(names)} ({examples})")
    more = f", and {len(groups) - limit} more op types" if len(groups) > limit else ""
    return (f"placement: {len(report.fallbacks)} of {requested_gpu} ops of the training step placed on a GPU ran on "
            f"the CPU (no GPU kernel for their type and dtype; soft placement moved them, and each step copies their "
            f"inputs and outputs between the GPU and the host): {'; '.join(shown)}{more}")


def run_listing_placement(session, fetches, feed_dict=None, out=None):
    """session.run(fetches) (a MeshSession or tf.Session) with the partition graphs returned; prints
    `describe_placement` once and returns (the values, the PlacementReport)."""
    import tensorflow.compat.v1 as tf
    session = getattr(session, "session", session)  # a MeshSession's tf.Session
    run_metadata = tf.RunMetadata()
    options = tf.RunOptions(output_partition_graphs=True)
    values = session.run(fetches, feed_dict=feed_dict, options=options, run_metadata=run_metadata)
    graph = session.graph
    ops = placed_ops(graph, run_metadata)
    report = PlacementReport(ops, cpu_fallbacks(ops))
    print(describe_placement(report), file=out or sys.stdout, flush=True)
    return values, report


class PlacementListing(Callback):
    """The run's first step lists the ops that ran elsewhere than placed (from its partition graphs; not on a TPU,
    whose XLA compiles the whole step): on GPUs the line is printed (`shown`), elsewhere kept quiet (the line speaks
    of GPUs); `then(report)` gets the PlacementReport after that step (selfcheck/job.py)."""

    def __init__(self, shown: bool, then: Optional[Callable[[PlacementReport], None]] = None):
        self.shown, self.then = shown, then

    def on_open(self, run: Run) -> None:
        run.program.list_placement(out=None if self.shown else io.StringIO(), then=self.then)
