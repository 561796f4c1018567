"""--auto_layout and --auto_layout_and_mesh_shape: mesh-tensorflow's layout optimizer on the model's graph.

mesh-tensorflow's auto_mtf picks the layout (which tensor dimension is split over which mesh dimension)
that minimises the peak per-device memory of the graph, as an integer program solved by OR-tools' CP-SAT.
It works on the mtf graph alone (plan/model_graph.py builds the full training graph with the training step's
own code: forward, backward and optimizer updates), so planning needs none of the config's hardware.

Three changes to the stock optimizer, none of which changes its answer on a graph it handles:

* Only dimensions a config may name in `layout` (models/layout.py `tensor_dim_sizes`) are offered to the
  solver, so every layout it returns loads and validates. (Left alone it also splits internal dimensions of
  local attention, which a config cannot express.)
* The memory constraints are aggregated. Stock auto_mtf adds one constraint per scheduled operation, each a
  sum over every live tensor: for a 40-layer training graph that is ~21,000 constraints with hundreds of
  terms, and building them takes minutes. Tensors with the same dimension set share the solver's
  assignment variables, so each constraint is a vector of coefficients over those variables; identical
  vectors and vectors dominated by another (every coefficient smaller or equal, and the variables are
  0/1) add nothing, and are dropped. The integer program keeps the same optimum.
* Operations and tensors are renamed to unique names first (see `unique_names`): with recompute_grad the
  stock scheduler otherwise plans on a prefix of the training step only.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Optional

import mesh_tensorflow as mtf
import mesh_tensorflow.auto_mtf  # noqa: F401  (not imported by `import mesh_tensorflow`)
import numpy as np
from mesh_tensorflow.auto_mtf import layout_optimizer, memory_estimator, scheduler
from mesh_tensorflow.auto_mtf import graph_interface as graph_interface_lib
from ortools.sat.python import cp_model

from plan import model_graph
from modelpath.files import write_json_atomically
from schema import ConfigError, GPTConfig, parse_mesh_shape
from config import replace
from models.layout import tensor_dim_sizes

MESH_DIM_NAMES = ("x", "y", "z", "w")


# ----------------------------------------------------------------------------------------------------
# The optimizer


class _PlanningEstimator(memory_estimator.MemoryEstimator):
    """auto_mtf's estimator, restricted to the config's layout dimensions and able to share one
    GraphInterface between mesh shapes (it depends on the graph only)."""

    def __init__(self, mtf_graph, mesh_shape, mtf_outputs, allowed_dims, graph_interface=None):
        super().__init__(mtf_graph, mesh_shape, mtf_outputs)
        self._allowed = frozenset(allowed_dims)
        self._graph_interface = graph_interface

    def _compute_layout_validator(self):
        super()._compute_layout_validator()
        validator = self._layout_validator
        validator._splittable_mtf_dimension_names = (  # pylint: disable=protected-access
            set(validator.splittable_mtf_dimension_names) & self._allowed)


class _AggregatedLayoutOptimizer(layout_optimizer.LayoutOptimizer):
    """auto_mtf's LayoutOptimizer with the same variables, constraints and objective, but with the memory
    constraints aggregated and deduplicated (see the module docstring). `schedule` is the operation order
    (auto_mtf's LIST scheduler), shared between mesh shapes."""

    def __init__(self, estimator, schedule):
        self._schedule = schedule
        self.memory_constraints = (0, 0)  # (stock: one per scheduled operation, kept), for reporting
        super().__init__(estimator)

    def _add_constraints(self):
        model = self._model
        validator = self._layout_validator
        mesh_dims = list(validator.mesh_dimension_name_to_size)
        splittable = validator.splittable_mtf_dimension_names
        global_vars, local_vars = self._global_vars, self._local_vars

        # An operation may not split two of its dimensions over the same mesh dimension.
        for mesh_dim in mesh_dims:
            for dim_set in self._operation_mtf_dimension_sets:
                if len(dim_set) > 1:
                    model.Add(sum(global_vars[(d, mesh_dim)] for d in dim_set) <= 1)
        # A tensor dimension is split over at most one mesh dimension, and only where it divides evenly.
        for dim in splittable:
            model.Add(sum(global_vars[(dim, m)] for m in mesh_dims) <= 1)
            for mesh_dim in mesh_dims:
                if not validator.is_valid_assignment(dim, mesh_dim):
                    model.Add(global_vars[(dim, mesh_dim)] == 0)
        # Exactly one local assignment per dimension set, agreeing with the global variables.
        for dim_set in self._mtf_dimension_sets:
            names = {id(a): layout_optimizer._local_var_name(dim_set, a) for a in self._assignments[dim_set]}
            model.Add(sum(local_vars[dim_set][names[id(a)]] for a in self._assignments[dim_set]) == 1)
            for assignment in self._assignments[dim_set]:
                local = local_vars[dim_set][names[id(assignment)]]
                for dim in dim_set:
                    if dim in assignment:
                        model.AddImplication(local, global_vars[(dim, assignment[dim])])
                    else:
                        for mesh_dim in mesh_dims:
                            model.AddImplication(global_vars[(dim, mesh_dim)], local.Not())

        # Memory: peak >= the bytes live at every step of the schedule, as coefficients over local variables.
        self._columns, column_vars = [], []
        column_of = {}
        for dim_set in self._mtf_dimension_sets:
            for assignment in self._assignments[dim_set]:
                name = layout_optimizer._local_var_name(dim_set, assignment)
                column_of[(dim_set, name)] = len(column_vars)
                self._columns.append((dim_set, assignment))
                column_vars.append(local_vars[dim_set][name])
        rows = self._live_bytes_rows(column_of, len(column_vars))
        self._kept = np.stack(_undominated(rows)) if rows else np.zeros((0, len(column_vars)), np.int64)
        self.memory_constraints = (len(self._schedule), len(self._kept))
        for row in self._kept:
            nonzero = np.nonzero(row)[0]
            model.Add(cp_model.LinearExpr.WeightedSum([column_vars[i] for i in nonzero],
                                                      [int(row[i]) for i in nonzero]) <= self._memory_var)

    def _live_bytes_rows(self, column_of: dict, n_columns: int) -> list:
        """Replays the schedule as auto_mtf's compute_memory_contents_under_schedule does, keeping, instead of
        each step's set of live tensors, its bytes per assignment column; returns the distinct rows."""
        graph, sizes = self._graph, self._layout_validator.mesh_dimension_name_to_size
        by_signature, terms = {}, {}
        for tensor in graph.get_all_tensor_names():
            if not graph.is_tensor_on_canonical_device(tensor):
                continue
            dim_set = self._tensor_name_to_mtf_dimension_set[tensor]
            signature = (dim_set, graph.get_tensor_dtype(tensor).size,
                         tuple(graph.get_tensor_mtf_dimension_names(tensor)),
                         tuple(graph.get_tensor_shape(tensor).as_list()))
            if signature not in by_signature:
                cols, values = [], []
                for assignment in self._assignments[dim_set]:
                    cols.append(column_of[(dim_set, layout_optimizer._local_var_name(dim_set, assignment))])
                    values.append(int(graph.get_tensor_size(tensor, assignment, sizes)))
                by_signature[signature] = (np.array(cols, np.int64), np.array(values, np.int64))
            terms[tensor] = by_signature[signature]

        out_degree = graph._compute_initial_out_degree()  # pylint: disable=protected-access
        operations = list(graph.get_all_operation_names())
        current = np.zeros(n_columns, np.int64)
        live, unique = set(), {}

        def change(tensor, sign):
            if tensor in terms:
                cols, values = terms[tensor]
                current[cols] += sign * values

        for op_id in self._schedule:
            name = operations[op_id]
            outputs = list(graph.get_operation_output_names(name))
            for t in outputs:
                if t not in live:
                    live.add(t)
                    change(t, +1)
            unique.setdefault(current.tobytes(), current.copy())
            for t in outputs:
                if out_degree[t] == 0 and t in live:
                    live.remove(t)
                    change(t, -1)
            for t in graph.get_operation_input_names(name):
                out_degree[t] -= 1
                if out_degree[t] == 0 and t in live:
                    live.remove(t)
                    change(t, -1)
        return list(unique.values())

    def evaluate_layout(self, layout):
        """auto_mtf's peak-memory value of a layout ('a:x;b:y'), from the aggregated rows (the same number the
        stock method sums tensor by tensor)."""
        chosen = {}
        for pair in filter(None, str(layout).split(";")):
            dim, mesh_dim = pair.split(":", 1)
            if dim in self._layout_validator.splittable_mtf_dimension_names:
                chosen[dim] = mesh_dim
        y = np.array([1 if assignment == {d: chosen[d] for d in dim_set if d in chosen} else 0
                      for dim_set, assignment in self._columns], np.int64)
        return float((self._kept @ y).max()) if len(self._kept) else 0.0


def unique_names(graph: mtf.Graph) -> None:
    """Gives every operation and tensor of a (planning-only) graph its own name. auto_mtf's GraphInterface
    finds operations and tensors by name, but recompute_grad rebuilds each block's forward operations under
    the same names for the backward pass, and a slicewise operation with two outputs names both ':0'; with
    clashing names the scheduler silently orders only a prefix of the graph."""
    seen = set()
    for i, op in enumerate(graph.operations):
        if op.name in seen:
            op._name = f"{op.name}_{i}"  # pylint: disable=protected-access
        seen.add(op.name)
        for j, t in enumerate(op.outputs):
            t._name = f"{op.name}:{j}"  # pylint: disable=protected-access


def _undominated(rows: list) -> list:
    """The rows no other row dominates (>= in every coordinate). Exact pruning of `z >= row . y`, y >= 0."""
    if not rows:
        return []
    matrix = np.stack(rows)
    order = np.argsort(-matrix.sum(axis=1), kind="stable")
    kept = np.zeros_like(matrix)
    n = 0
    for i in order:
        row = matrix[i]
        if n and np.any(np.all(kept[:n] >= row, axis=1)):
            continue
        kept[n] = row
        n += 1
    return list(kept[:n])


# ----------------------------------------------------------------------------------------------------
# Planning


@dataclass
class LayoutPlan:
    mesh_shape: str              # config format, e.g. "x:64,y:8"
    layout: str                  # config format, e.g. "batch:x,heads:y"
    peak_bytes: float            # auto_mtf's estimate of peak per-device memory (planned graph)
    planned_layers: int
    n_layer: int
    seconds: float
    candidates: list = field(default_factory=list)  # [(mesh_shape, layout, peak_bytes)] tried
    constraints: tuple = (0, 0)  # memory constraints (stock, after aggregation) of the chosen mesh


def to_config_layout(mtf_layout: str) -> str:
    """auto_mtf's 'a:x;b:y' -> the config's 'a:x,b:y' (sorted by tensor dimension)."""
    rules = [r for r in str(mtf_layout).replace(";", ",").split(",") if r]
    return ",".join(sorted(rules))


def to_mesh_string(mesh_dims: list[tuple[str, int]]) -> str:
    return ",".join(f"{name}:{size}" for name, size in mesh_dims)


def mesh_shape_candidates(n_devices: int, max_dims: int = 2) -> list[list[int]]:
    """Every way to write n_devices as an ordered product of up to max_dims factors > 1, largest first
    ([n], [n/2, 2], ...): the meshes --auto_layout_and_mesh_shape tries."""
    if n_devices < 1:
        raise ConfigError(f"the number of devices must be at least 1, got {n_devices}")
    if n_devices == 1:
        return [[1]]
    found = []

    def extend(prefix, remaining, largest):
        if remaining == 1:
            found.append(prefix)
            return
        if len(prefix) == max_dims:
            return
        for f in range(min(largest, remaining), 1, -1):
            if remaining % f == 0:
                extend(prefix + [f], remaining // f, f)

    extend([], n_devices, n_devices)
    return found


class _Planner:
    """Holds one built graph and its schedule; solves for any mesh shape."""

    def __init__(self, cfg: GPTConfig, n_layer: Optional[int]):
        self.cfg = cfg
        self.built = model_graph.build(cfg, n_layer=n_layer)
        self.allowed = set(tensor_dim_sizes(cfg))
        unique_names(self.built.graph)
        with self.built.tf_graph.as_default():
            self.interface = graph_interface_lib.GraphInterface(self.built.graph)
            for output in (self.built.cross_entropy, self.built.objective):
                self.interface.set_tensor_final(output.name)
            self.schedule = list(scheduler.minimize_peak_memory(self.interface, "LIST"))
            if len(self.schedule) != len(self.built.graph.operations):  # would plan on part of the step
                raise RuntimeError(f"auto_mtf's scheduler ordered {len(self.schedule)} of "
                                   f"{len(self.built.graph.operations)} operations")

    def solve(self, mesh_dims: list[tuple[str, int]]):
        mesh = mtf.Shape([mtf.Dimension(name, size) for name, size in mesh_dims])
        with self.built.tf_graph.as_default():
            estimator = _PlanningEstimator(self.built.graph, mesh, [self.built.cross_entropy, self.built.objective],
                                           self.allowed, graph_interface=self.interface)
            optimizer = _AggregatedLayoutOptimizer(estimator, self.schedule)
            solution = optimizer.solve()
            peak = optimizer.evaluate_layout(solution)
        trivial = {name for name, size in mesh_dims if size == 1}  # splitting over a size-1 dimension is a no-op
        layout = ",".join(r for r in to_config_layout(solution).split(",") if r and r.split(":")[1] not in trivial)
        return layout, float(peak), optimizer.memory_constraints


def _check(cfg: GPTConfig, mesh_shape: str, layout: str) -> GPTConfig:
    """The config with the planned mesh and layout, validated as any config is."""
    try:
        return replace(cfg, mesh_shape=mesh_shape, layout=layout)
    except ConfigError as e:  # would be a planner bug: the solver is restricted to valid layouts
        raise ConfigError(f"planned layout {layout!r} on mesh {mesh_shape!r} does not validate: {e}")


def auto_layout(cfg: GPTConfig, mesh_shape: Optional[str] = None, n_layer: Optional[int] = None) -> LayoutPlan:
    """The layout auto_mtf picks for the config's mesh_shape (or `mesh_shape`). `n_layer` plans on the
    first layers only (default: the whole model)."""
    start = time.perf_counter()
    mesh_dims = parse_mesh_shape(mesh_shape or cfg.mesh_shape)
    planner = _Planner(cfg, n_layer)
    layout, peak, constraints = planner.solve(mesh_dims)
    mesh_string = to_mesh_string(mesh_dims)
    _check(cfg, mesh_string, layout)
    return LayoutPlan(mesh_string, layout, peak, planner.built.cfg.n_layer, cfg.n_layer,
                      time.perf_counter() - start, [(mesh_string, layout, peak)], constraints)


def auto_layout_and_mesh_shape(cfg: GPTConfig, n_devices: int, max_dims: int = 2,
                               n_layer: Optional[int] = None) -> LayoutPlan:
    """The mesh shape over n_devices (up to max_dims dimensions, named x, y, ...) and layout with the
    lowest peak memory by auto_mtf's estimate. Ties go to the mesh with fewer dimensions, then to the
    earlier candidate (larger first dimension)."""
    start = time.perf_counter()
    if max_dims < 1 or max_dims > len(MESH_DIM_NAMES):
        raise ConfigError(f"max mesh dimensions must be 1..{len(MESH_DIM_NAMES)}, got {max_dims}")
    planner = _Planner(cfg, n_layer)
    best, candidates = None, []
    for sizes in mesh_shape_candidates(n_devices, max_dims):
        mesh_dims = list(zip(MESH_DIM_NAMES, sizes)) if n_devices > 1 else [("all", 1)]
        layout, peak, constraints = planner.solve(mesh_dims)
        mesh_string = to_mesh_string(mesh_dims)
        candidates.append((mesh_string, layout, peak))
        if best is None or peak < best[2] * (1 - 1e-9):
            best = (mesh_string, layout, peak, constraints)
    _check(cfg, best[0], best[1])
    return LayoutPlan(best[0], best[1], best[2], planner.built.cfg.n_layer, cfg.n_layer,
                      time.perf_counter() - start, candidates, best[3])


# ----------------------------------------------------------------------------------------------------
# Output


def describe(plan: LayoutPlan, cfg_name: str, with_mesh: bool) -> str:
    gib = plan.peak_bytes / 2 ** 30
    quoted_empty = "''"
    lines = []
    if with_mesh:
        lines.append("meshes tried (auto_mtf's peak-memory estimate per device):")
        for mesh_string, layout, peak in plan.candidates:
            mark = "  <- chosen" if (mesh_string, layout) == (plan.mesh_shape, plan.layout) else ""
            lines.append(f"  {mesh_string:<12} {layout or '(nothing split)':<66} {peak / 2 ** 30:10.3f} GiB{mark}")
    layers = (f"all {plan.n_layer} layers" if plan.planned_layers == plan.n_layer else
              f"the first {plan.planned_layers} of {plan.n_layer} layers (layouts are per dimension name, the "
              f"same in every layer)")
    lines += [
        f"auto layout for {cfg_name}, planned on {layers} of the training graph in {plan.seconds:.1f} s:",
        f'  "mesh_shape": "{plan.mesh_shape}",',
        f'  "layout": "{plan.layout}",',
        f"  peak memory per device by auto_mtf's estimate: {gib:.3f} GiB (activation-dtype tensors of the "
        f"planned graph; see --dry_run for weights, optimizer state and activations)",
        "  auto_mtf minimises peak memory only and does not model communication: a layout that splits `batch` "
        "(data parallel) usually trains faster where it fits; compare layouts with --dry_run",
        "to use it: put these two lines in the config, or run with",
        f"  --mesh_shape {plan.mesh_shape} --layout {plan.layout or quoted_empty}",
        "  (or pass --write_config PATH to write a copy of the config with them)",
    ]
    return "\n".join(lines)


def write_config(source_path: str, plan: LayoutPlan, out_path: str) -> str:
    """A copy of the JSON config at source_path with mesh_shape and layout replaced."""
    with open(source_path) as f:
        raw = json.load(f)
    raw["mesh_shape"], raw["layout"] = plan.mesh_shape, plan.layout
    folder = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(folder, exist_ok=True)
    write_json_atomically(out_path, raw, indent=2)
    return out_path
