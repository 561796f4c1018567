"""Running infer/outputs.py's PREDICT outputs over rows of examples from a checkpoint, a batch at a time: for
--predict's samples, the eval tasks' scores and tools that need logits; on CPUs and GPUs or on a TPU."""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import tensorflow.compat.v1 as tf
from tqdm import tqdm

from schema import GPTConfig
from infer import outputs
from modelpath import checkpoints
from execution import runner
from devices.placement import Placement
from execution.mesh_session import padded_batch
from models.optimizers import slot_patterns
from models.sampling import SamplingOptions


def prediction_program(cfg: GPTConfig, placement: Placement, rows: dict, batch_size: int,
                       options=None, graph: Optional[tf.Graph] = None) -> runner.Program:
    """infer/outputs.py's outputs on the placement for `batch_size` rows like those of `rows`, fed per call. The
    graph seed is training's: without a checkpoint, the outputs are those of the initial weights training starts
    from. `graph`: built into it, using the weights of the programs built there before (runner.Program)."""
    def step(mesh, impl, features):
        return outputs.predictions(cfg, mesh, impl, features, options, gather=placement.whole_outputs)
    return runner.Program(cfg, placement, step, runner.Fed.like(rows, batch_size), seed=cfg.seed, graph=graph)


class Predictor:
    """infer/outputs.py's outputs from one checkpoint, over programs built once per kind of rows (their arrays'
    dtypes and row shapes, the batch size and the sampling options that shape a program: the drawn ones,
    models/sampling.DRAWN, are fed with each batch's rows, a row's own where `rows` has them) and kept: `restore(checkpoint)` moves them all
    to another checkpoint of the model without building anything again. Training's evaluations at each checkpoint
    score through one (evals/tasks.py, evals/harness.py).

    Every program is built into one graph, whose one session holds one copy of the model's weights (no optimizer
    state) for them all until `close`: the mesh's variables are found by name by each later build, so a program
    adds its ops and no weights, and a restore reads the checkpoint once. On a TPU (placement.programs_share_weights
    false), or on a TensorFlow that cannot reopen a finalized graph (runner.GRAPHS_REOPEN), each program keeps a
    graph and session of its own, and a copy of the weights each."""

    def __init__(self, cfg: GPTConfig, placement: Placement, checkpoint: Optional[str] = None):
        if checkpoint and tf.io.gfile.isdir(checkpoint):
            checkpoint = checkpoints.require_checkpoint(checkpoint)
        self.cfg, self.placement, self.checkpoint = cfg, placement, checkpoint
        self._programs: dict = {}  # key -> (program, session)
        self._shared: Optional[tuple] = None  # (graph, session) every program is built into and run in, once open

    @property
    def _sessions(self) -> list:
        """Each open session once."""
        return list({id(session): session for _, session in self._programs.values()}.values())

    def variable_bytes(self) -> int:
        """The bytes of the variables its open sessions hold: one copy of the weights (with a mesh of several
        devices, their masters and the devices' slices) where programs share them, a copy per program on a TPU."""
        return sum(runner.variable_bytes(graph) for graph in
                   {id(program.graph): program.graph for program, _ in self._programs.values()}.values())

    def restore(self, checkpoint: str) -> None:
        """Every program kept restored from `checkpoint` (a prefix), and the ones built from now on opened at it."""
        self.checkpoint = checkpoint
        for session in self._sessions:
            session.restore(checkpoint)

    def _program(self, rows: dict, batch_size: int, options):
        key = (tuple((name, value.dtype.str, value.shape[1:]) for name, value in sorted(rows.items())), batch_size,
               options)
        if key not in self._programs:
            if self._shared is not None:
                graph, session = self._shared
                program = prediction_program(self.cfg, self.placement, rows, batch_size, options, graph)
                if program.created_variables:  # uninitialised in the open session: a model that is not the same
                    raise RuntimeError(f"a prediction program of {self.cfg.model_path} for other rows created "
                                       f"variables the first one lacks ({', '.join(program.created_variables[:3])}"
                                       f"): its weights cannot be shared")
            else:
                graph = tf.Graph() if self.placement.programs_share_weights and runner.GRAPHS_REOPEN else None
                program = prediction_program(self.cfg, self.placement, rows, batch_size, options, graph)
                session = program.open(self.checkpoint, slot_patterns(), saves=False)
                if graph is not None:
                    self._shared = (graph, session)
            self._programs[key] = (program, session)
        return self._programs[key]

    def predict(self, rows: dict, batch_size: int, options=None, progress: bool = False,
                on_batch: Optional[Callable[[int], None]] = None, label: Optional[str] = None) -> dict:
        """The outputs for every row of `rows` (see `predict`)."""
        rows = {name: np.asarray(value) for name, value in rows.items()}
        count = len(next(iter(rows.values())))
        if isinstance(options, SamplingOptions):  # the drawn options fed per row: a few programs for all settings
            rows = {**options.draw_rows(count), **rows}
            options = options.program(rows)
        if label:  # the graph's build, the restore and the first call's optimisation: seconds without output
            print(f"{label}: building the graph, {checkpoints.weights_origin(self.checkpoint)} ...", flush=True)
        program, session = self._program(rows, batch_size, options)
        if label:
            print(f"{label}: running ...", flush=True)
        batches = range(0, count, batch_size)
        if progress and len(batches) > 1:
            batches = tqdm(batches, unit="batch", desc="predict", dynamic_ncols=True)
        results = []
        for first in batches:
            batch = {name: padded_batch(value[first:first + batch_size], batch_size) for name, value in rows.items()}
            out = program.run(session, 1, batch)[0]
            results.append({name: value[:min(batch_size, count - first)] for name, value in out.items()})
            if on_batch:
                on_batch(min(batch_size, count - first))
        return {name: np.concatenate([r[name] for r in results]) for name in results[0]}

    def close(self) -> None:
        for session in self._sessions:
            session.close()
        self._programs.clear()
        self._shared = None

    def __enter__(self) -> "Predictor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def predict(cfg: GPTConfig, placement: Placement, rows: dict, batch_size: int,
            checkpoint: Optional[str] = None, options=None, progress: bool = False,
            on_batch: Optional[Callable[[int], None]] = None, label: Optional[str] = None) -> dict:
    """infer/outputs.py's outputs for every row of `rows` (numpy arrays, one row per example), run
    `batch_size` rows at a time (the last batch padded); from `checkpoint`, a checkpoint prefix or a folder
    (its latest), or from the seeded initial weights when None. `progress` shows a bar of batches;
    `on_batch(rows)` is called after each batch with its count of rows (a caller's own progress bar). `label`: a
    line "LABEL: building the graph, restoring CHECKPOINT ..." before the program is built and "LABEL: running ..."
    before its first call, for a console that would otherwise wait seconds without a word."""
    with Predictor(cfg, placement, checkpoint) as predictor:
        return predictor.predict(rows, batch_size, options, progress, on_batch, label)
