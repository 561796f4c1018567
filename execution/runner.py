"""Running a job's step on a placement: how training, evaluation, prediction, the SavedModel export and
--selfcheck run their graphs, on CPU devices or GPUs of one host, the hosts of a cluster, or a TPU.

A job hands over its step, `step(mesh, mesh_impl, inputs) -> meshes.Lowered`: it builds its mesh-tensorflow
graph on the mesh it is given and lowers it (train/step.py's training step, evals/validation.py's evaluation
loss, infer/outputs.py's PREDICT outputs), and where its inputs come from: `Batches` (a tf.data.Dataset, read
through an iterator) or `Fed` (arrays fed per session call). `Program` builds the step in a graph of its own on
the placement's mesh (`placement.mesh`: a placement mesh over devices, or a TPU's SIMD mesh), with the fused
kernels' path the placement chose (`placement.kernels`, models/kernels/common.py) given where the graph is
built. The placement says how its steps run (`placement.steps`): one per session call (`StepPerCall`), or up
to `steps_per_call` in one call inside a TPU's replicated loop (devices/tpu.py's `LoopSteps`). `open` opens the
session that restores a checkpoint (execution/mesh_session.py) and `run` runs steps, returning each step's outputs.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Mapping, Optional

import numpy as np
import tensorflow.compat.v1 as tf

from models.kernels import common
from execution import op_listing
from execution.meshes import Lowered
from execution.mesh_session import MeshSession

# (mesh, mesh_impl, inputs) -> the step's graph lowered; `inputs` as the step's input source gives them
Step = Callable[[Any, Any, Any], Lowered]


def in_memory(ds: tf.data.Dataset) -> tf.data.Dataset:
    """`ds`, a dataset of arrays already in memory, without tf.data's autotuning: it needs none, and the autotuning
    thread makes the closing of every session that read the dataset wait for it (0.25-0.5 s a run, measured on
    tiny training runs). The input pipeline of real data (data/inputs.py) keeps it for its parallel maps."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def fixed_batches(rows, batch_size: int) -> Callable[[int], tf.data.Dataset]:
    """(start_step) -> `rows` (an array [n, n_ctx + 1] in memory) cycled in order as (inputs, labels) batches,
    from that step on: every layout and a resumed run see the same batches (the self-check, the tests)."""
    def from_step(start_step: int) -> tf.data.Dataset:
        ds = in_memory(tf.data.Dataset.from_tensor_slices((rows[:, :-1], rows[:, 1:])))
        return ds.repeat().batch(batch_size, drop_remainder=True).skip(start_step)
    return from_step


class Batches:
    """Inputs read from the tf.data.Dataset that `make()` builds inside the program's graph (for training and
    evaluation: (inputs, labels) batches), through an iterator that `Program.start` initialises."""

    def __init__(self, make: Callable[[], tf.data.Dataset]):
        self.make = make
        self.iterator = None

    def tensors(self):
        self.iterator = tf.data.make_initializable_iterator(self.make())
        return self.iterator.get_next()

    def start(self, session) -> None:
        session.run(self.iterator.initializer)

    def feed_dict(self, values) -> None:
        return None


class Fed:
    """Inputs fed per session call: one placeholder per name, of the (dtype, shape) given."""

    def __init__(self, specs: Mapping[str, tuple]):
        self.specs = dict(specs)
        self.placeholders = {}

    @classmethod
    def like(cls, rows: Mapping[str, np.ndarray], batch_size: int) -> "Fed":
        """Placeholders for `batch_size` rows of each array of `rows` (one row per example)."""
        return cls({name: (tf.as_dtype(value.dtype), [batch_size] + list(value.shape[1:]))
                    for name, value in rows.items()})

    def tensors(self) -> dict:
        self.placeholders = {name: tf.placeholder(dtype, shape, name=name)
                             for name, (dtype, shape) in self.specs.items()}
        return dict(self.placeholders)

    def start(self, session) -> None:
        pass

    def feed_dict(self, values: Optional[Mapping[str, np.ndarray]]) -> Optional[dict]:
        return {self.placeholders[name]: value for name, value in values.items()} if values else None


class StepPerCall:
    """The step run once per session call: on CPU devices and GPUs, of this host or of a cluster's hosts."""
    steps_per_call = 1

    def __init__(self, lowered: Lowered):
        self.lowered = lowered
        self.fetches = {"outputs": lowered.outputs}
        if lowered.train_op is not None:
            self.fetches["train"] = lowered.train_op

    def run(self, session, steps: int, feed_dict=None, listing: bool = False, out=None) -> list:
        """`steps` steps, a session call each; `listing`: the first call also lists where the step's ops ran
        (devices/gpus.py), returned as the second value."""
        results, report = [], None
        for _ in range(steps):
            if listing and report is None:
                values, report = op_listing.run_listing_placement(session, self.fetches, feed_dict, out=out)
            else:
                values = session.run(self.fetches, feed_dict=feed_dict)
            results.append(values["outputs"])
        return (results, report) if listing else results


VARIABLE_OPS = ("VarHandleOp", "VariableV2", "Variable")


def variable_names(graph: tf.Graph) -> set:
    """The names of every variable in `graph`, in a collection or not (mesh-tensorflow's slices are in none)."""
    return {op.name for op in graph.get_operations() if op.type in VARIABLE_OPS}


def variable_bytes(graph: tf.Graph) -> int:
    """The bytes of every variable in `graph` (what a session on it holds for them): masters, slices, state."""
    return sum(tf.TensorShape(op.get_attr("shape")).num_elements() * tf.as_dtype(op.get_attr("dtype")).size
               for op in graph.get_operations() if op.type in VARIABLE_OPS)


def reusing_variables():
    """The default graph's variables found by name when built again (tf.get_variable, which mesh-tensorflow's
    masters and slices are made by), created where missing."""
    return tf.variable_scope(tf.get_variable_scope(), reuse=tf.AUTO_REUSE)


# TensorFlow's internal way to add ops to a finalized graph (2.20, 2.21; no public one): without it a Predictor's
# programs each keep a graph, session and copy of the weights of their own (infer/run.py), as on a TPU.
GRAPHS_REOPEN = hasattr(tf.Graph, "_unsafe_unfinalize")


@contextlib.contextmanager
def unfinalized(graph: tf.Graph):
    """`graph` open to new ops inside, finalized again after if it was: a session's graph stays closed to the
    ops a running loop might add by mistake (execution/mesh_session.py), but takes a program built into it."""
    was_finalized = graph.finalized
    if was_finalized:
        if not GRAPHS_REOPEN:
            raise RuntimeError(f"TensorFlow {tf.__version__} cannot add ops to a finalized graph (no "
                               f"Graph._unsafe_unfinalize): build the program into a graph of its own")
        graph._unsafe_unfinalize()  # TF's own way back (no public one): the graph is extended, not rewritten
    try:
        yield graph
    finally:
        if was_finalized:
            graph.finalize()


class Program:
    """`step` built on `placement` over `inputs`, in a graph of its own (or `graph`), ready to open a session on
    and run.

    `steps_per_call`: how many steps one session call may run where the placement runs several per call (a
    TPU's loop; elsewhere one). `seed`: the graph's random seed (training's; None leaves TensorFlow's).

    `graph`: build into this graph (finalized or not) instead of a new one, beside the programs of the same model
    built there before, whose tf variables (mesh-tensorflow's masters and the devices' slices, found by name) this
    one uses instead of creating its own: one copy of the weights, in a session open on the graph, serves them all
    (infer/run.py's Predictor). `created_variables`: the names of the variables this build created (a program
    sharing another's weights creates none)."""

    def __init__(self, cfg, placement, step: Step, inputs, steps_per_call: int = 1, seed: Optional[int] = None,
                 graph: Optional[tf.Graph] = None):
        self.placement, self.inputs = placement, inputs
        self.graph = graph if graph is not None else tf.Graph()
        existing = variable_names(self.graph)
        # The fused kernels' path is the placement's: every kernel built while the step is built reads it.
        with unfinalized(self.graph), self.graph.as_default(), common.kernels(placement.kernels), \
                (reusing_variables() if graph is not None else contextlib.nullcontext()):
            if seed is not None:
                tf.set_random_seed(seed)
            self.driver = placement.steps(inputs.tensors, lambda tensors: step(*placement.mesh(cfg), tensors),
                                          steps_per_call)
        self.created_variables = sorted(variable_names(self.graph) - existing)
        self.lowered = self.driver.lowered
        self._listing, self._listing_out, self._on_listed = False, None, None
        self.placement_report = None  # execution.op_listing.PlacementReport of the first step, after list_placement()

    @property
    def steps_per_call(self) -> int:
        return self.driver.steps_per_call

    def list_placement(self, out=None, then: Optional[Callable[[Any], None]] = None) -> None:
        """The next step run also lists the ops that ran elsewhere than placed (devices/gpus.py: printed to `out`,
        default stdout, kept in `placement_report` and handed to `then`); where the session can list them
        (placement.op_listing None: not on a TPU, whose XLA compiles the whole step)."""
        self._listing, self._listing_out, self._on_listed = self.placement.op_listing is None, out, then

    def open(self, checkpoint: Optional[str], slot_patterns: Mapping[str, str] = {},
             finalize: bool = True, saves: bool = True) -> MeshSession:
        """The session on the placement (its master; in-process when it has none) with its session config, the
        variables restored from `checkpoint` (or initialised from their seeds when None) and copied to the mesh's
        slices; `saves=False` for a session that never writes a checkpoint (MeshSession)."""
        return MeshSession(self.graph, self.lowered.lowering, self.placement.target,
                           self.placement.session_config(), checkpoint, finalize, slot_patterns, saves)

    def start(self, session) -> None:
        """Initialises the input pipeline (Batches); before the first `run`."""
        self.inputs.start(session)

    def run(self, session, steps: int = 1, feed: Optional[Mapping[str, np.ndarray]] = None) -> list:
        """Runs `steps` steps (Fed inputs: `feed`, name -> array, fed to each); returns each step's outputs."""
        feed_dict = self.inputs.feed_dict(feed)
        if self._listing:
            self._listing = False
            results, self.placement_report = self.driver.run(session, steps, feed_dict, listing=True,
                                                             out=self._listing_out)
            if self._on_listed:
                self._on_listed(self.placement_report)
            return results
        return self.driver.run(session, steps, feed_dict)
