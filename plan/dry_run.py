"""--dry_run: the shape of a training run before it starts, and the smallest mesh it fits on.

Everything comes from the model's real training graph (plan/model_graph.py: the training step's own, built
without devices):

* parameters: the trainable variables of the graph, exactly (models/flops.py parameter_count is the
  closed-form cross-check for the default architecture);
* weights and optimizer state per device: every variable's slice shape under the mesh and layout, in its
  slice dtype: what the placement mesh allocates on each device;
* gradients: one slice-sized float32 copy of every trainable variable (global-norm clipping needs all of
  them before the first update);
* activations: the forward tensors the backward pass reads (so they stay alive from the forward to the
  backward pass), each at its slice size under the layout and in its own dtype, plus the working set of the
  backward pass: with recompute_grad, one block's activations are rebuilt while its gradient is computed,
  and the largest forward tensor's gradient exists beside it. This is an estimate: TensorFlow's allocator,
  fusion and scheduling move the real peak both ways.

"Per device" is the same on every device: mesh-tensorflow splits tensors evenly. It is device memory: on GPUs
each GPU holds its slices (weights, optimizer state, gradients, activations), while the master copies of all
variables, optimizer state included, live in host RAM (execution/meshes.py places them on the host's CPU, or
spreads them over the hosts of a cluster or a TPU); on CPU devices the host's RAM holds both. The smallest
mesh search tries, for 1, 2, 4, ... devices, every one- and two-dimensional mesh with data-parallel,
Megatron-style (heads, mlp, vocab) and GPT-Neo-style (embd, memory_length) layouts, and reports the first
that fits.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Optional

import mesh_tensorflow as mtf

from config import replace
from models import flops
from models.attention import incremental_unsupported
from plan import model_graph
from schema import ConfigError, GPTConfig, batch_split, num_microbatches

_LAYER = re.compile(r"(?:^|/)h(\d+)/")
_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2 ** 10, "mib": 2 ** 20,
          "gib": 2 ** 30, "tib": 2 ** 40}


def parse_bytes(text: str) -> float:
    """'80GB' -> 80e9, '16GiB' -> 16 * 2**30, '512MB', '1.5e9'."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]i?b?|b)?\s*", str(text).lower())
    if not match:
        raise ConfigError(f"device memory {text!r} is not understood: write it like 80GB, 16GiB or 512MB")
    unit = match.group(2) or ""
    if unit and not unit.endswith("b"):
        unit += "b"
    return float(match.group(1)) * _UNITS[unit]


def human_bytes(n: float) -> str:
    for unit, scale in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale or unit == "KiB":
            return f"{n / scale:,.2f} {unit}"
    return f"{n:.0f} B"


# ----------------------------------------------------------------------------------------------------
# What the graph holds, independent of the layout


def _shape_key(shape: mtf.Shape) -> tuple:
    return tuple((d.name, d.size) for d in shape.dims)


@dataclass
class TensorSet:
    """Tensors grouped by (shape, bytes per element): {key: count}. Sizing under a layout is per key."""
    groups: dict = field(default_factory=dict)

    def add(self, shape: mtf.Shape, itemsize: int, count: int = 1) -> None:
        key = (_shape_key(shape), itemsize)
        self.groups[key] = self.groups.get(key, 0) + count

    def bytes(self, sizer: "Sizer", batch: Optional[int] = None) -> float:
        """Per-device bytes under sizer's layout; `batch` resizes the batch dimension (a micro-batch)."""
        return sum(count * sizer.slice_entries(_with_batch(shape, batch)) * itemsize
                   for (shape, itemsize), count in self.groups.items())

    def largest(self, sizer: "Sizer", batch: Optional[int] = None) -> float:
        return max((sizer.slice_entries(_with_batch(shape, batch)) * itemsize for (shape, itemsize) in self.groups),
                   default=0)


def _with_batch(key: tuple, batch: Optional[int]) -> tuple:
    if batch is None:
        return key
    return tuple((name, batch if name == "batch" else size) for name, size in key)


@dataclass
class GraphFacts:
    """What planning needs from the two training graphs (with and without recompute_grad)."""
    params: dict
    weights: TensorSet            # trainable variables at their slice dtype
    optimizer: TensorSet          # optimizer slots at their slice dtype
    gradients: TensorSet          # one float32 copy of every trainable variable
    weight_casts: TensorSet       # activation-dtype copies of the weights (bfloat16 precision only)
    saved: dict                   # recompute (bool) -> TensorSet of forward tensors the backward pass reads
    layer_saved: list             # per layer (by_layer_kind: per kind): TensorSet the backward pass reads, without
                                  # recompute
    largest_forward: TensorSet    # every forward tensor (for the largest one's gradient)
    master_bytes: float           # host memory of the master copies (all variables, master dtype)
    optimizer_name: str
    all_tensors: TensorSet        # every tensor of both graphs: a layout must split each of them evenly
    master_weight_bytes: float = 0.0  # the master copies of the trainable variables alone (what inference restores)
    activation_itemsize: int = 4      # bytes per element of the activations (the kv cache's dtype)


def _itemsize(dtype) -> int:
    return int(dtype.size)


def collect(cfg: GPTConfig, recompute_flags: tuple = (False, True)) -> GraphFacts:
    """Builds the training graph with and without recompute_grad and reads what planning needs (inference
    estimates need only the graph without: recompute_flags=(False,), half the time)."""
    graphs = {flag: model_graph.build(replace(cfg, recompute_grad=flag)) for flag in recompute_flags}
    plain = graphs[False]
    weights, optimizer, gradients, casts = TensorSet(), TensorSet(), TensorSet(), TensorSet()
    master = 0.0
    activation_itemsize = 4
    for v in plain.trainable_variables:
        activation_itemsize = _itemsize(v.activation_dtype)
        weights.add(v.shape, _itemsize(v.slice_dtype))
        gradients.add(v.shape, 4)
        if v.activation_dtype != v.slice_dtype:
            casts.add(v.shape, _itemsize(v.activation_dtype))
        master += v.shape.size * _itemsize(v.master_dtype)
    master_weights = master
    for v in plain.optimizer_variables:
        optimizer.add(v.shape, _itemsize(v.slice_dtype))
        master += v.shape.size * _itemsize(v.master_dtype)

    saved = {}
    layer_saved = [TensorSet() for _ in range(cfg.n_layer)]
    largest, every = TensorSet(), TensorSet()
    for flag, built in graphs.items():
        for op in built.graph.operations:
            for t in op.outputs:
                every.groups.setdefault((_shape_key(t.shape), _itemsize(t.dtype)), 1)
        forward = built.forward_operations
        forward_ids = {id(op) for op in forward}
        read_by_backward = {}
        for op in built.backward_operations:
            for t in op.inputs:
                if id(t.operation) in forward_ids and not isinstance(t.operation, mtf.Variable):
                    read_by_backward[id(t)] = t
        tensors = TensorSet()
        # An op that keeps tensors of its own for its backward pass (models/kernels/attention.py's blocked attention:
        # its softmax weights) lists their shapes as `kept_for_backward`; recomputed layers keep them only while
        # one layer's backward runs, so only the graph without recompute counts them.
        kept = [] if flag else [(shape, itemsize, op) for op in forward
                                for shape, itemsize in getattr(op, "kept_for_backward", ())]
        kept += [(t.shape, _itemsize(t.dtype), t.operation) for t in read_by_backward.values()]
        for shape, itemsize, op in kept:
            tensors.add(shape, itemsize)
            if not flag:
                match = _LAYER.search(op.name)
                if match and int(match.group(1)) < cfg.n_layer:
                    layer_saved[int(match.group(1))].add(shape, itemsize)
        saved[flag] = tensors
        if not flag:
            for op in forward:
                if not isinstance(op, mtf.Variable):
                    for t in op.outputs:
                        largest.add(t.shape, _itemsize(t.dtype))
    return GraphFacts(plain.parameter_count(), weights, optimizer, gradients, casts, saved, layer_saved, largest,
                      master, cfg.opt_name, every, master_weights, activation_itemsize)


def layer_kinds(cfg: GPTConfig) -> list:
    """Each layer's kind: (attention type, whether its feed-forward is a mixture of experts). Layers of one kind
    hold the same tensors (only the layer's index in their names differs)."""
    moe = set(cfg.moe_layers)
    return [(kind, layer in moe) for layer, kind in enumerate(cfg.attention_types)]


def _with_layers(cfg: GPTConfig, kinds: list) -> GPTConfig:
    return replace(cfg, n_layer=len(kinds), attention_types=tuple(kind for kind, _ in kinds),
                   moe_layers=tuple(layer for layer, (_, moe) in enumerate(kinds) if moe))


def _extrapolated(base: TensorSet, more: list) -> Optional[TensorSet]:
    """base's counts plus `extra` times what one more layer adds, for each (one more layer's set, extra) in
    `more`; None if one more layer has fewer of some tensor (the layers are not alike: use the whole graph)."""
    result = TensorSet(dict(base.groups))
    for bigger, extra in more:
        for key in set(base.groups) | set(bigger.groups):
            added = bigger.groups.get(key, 0) - base.groups.get(key, 0)
            if added < 0:
                return None
            if added:
                result.groups[key] = result.groups.get(key, 0) + extra * added
    return result


def _union(sets: list) -> TensorSet:
    """Every tensor shape of `sets` (for the largest one, and the layout's check), each counted once."""
    return TensorSet({key: 1 for s in sets for key in s.groups})


def by_layer_kind(cfg: GPTConfig, recompute_flags: tuple = (False, True)) -> GraphFacts:
    """collect's facts for cfg, from graphs of a few layers whatever n_layer is: one layer of each kind (the
    kinds in the order they first appear, so the model's first layer is first), and for each kind the same
    with one more layer of it. What one more layer adds, times the model's further layers of that kind, plus
    the first graph, is the whole model: the same counts collect reads from its graph (tests/plan/test_dry_run.py
    compares them). 3000 layers answer in seconds instead of minutes. Falls back to collect when the model is
    that shallow anyway, or when its layers turn out not to be alike."""
    kinds = layer_kinds(cfg)
    distinct = list(dict.fromkeys(kinds))
    if cfg.n_layer <= len(distinct) + 1:
        return collect(cfg, recompute_flags)
    base = collect(_with_layers(cfg, distinct), recompute_flags)
    more = [(collect(_with_layers(cfg, distinct + [kind]), recompute_flags), kinds.count(kind) - 1)
            for kind in distinct if kinds.count(kind) > 1]

    def sets(name):
        return [(getattr(facts, name), extra) for facts, extra in more]

    def scalar(value):  # a byte or parameter count: the first graph's plus the further layers'
        return value(base) + sum(extra * (value(facts) - value(base)) for facts, extra in more)

    extrapolated = {name: _extrapolated(getattr(base, name), sets(name))
                    for name in ("weights", "optimizer", "gradients", "weight_casts")}
    saved = {flag: _extrapolated(base.saved[flag], [(facts.saved[flag], extra) for facts, extra in more])
             for flag in base.saved}
    if any(s is None for s in list(extrapolated.values()) + list(saved.values())):
        return collect(cfg, recompute_flags)
    return GraphFacts(
        params={key: scalar(lambda facts: facts.params[key]) for key in base.params},
        saved=saved, layer_saved=base.layer_saved + [facts.layer_saved[-1] for facts, _ in more],
        largest_forward=_union([base.largest_forward] + [facts.largest_forward for facts, _ in more]),
        master_bytes=scalar(lambda facts: facts.master_bytes), optimizer_name=base.optimizer_name,
        all_tensors=_union([base.all_tensors] + [facts.all_tensors for facts, _ in more]),
        master_weight_bytes=scalar(lambda facts: facts.master_weight_bytes),
        activation_itemsize=base.activation_itemsize, **extrapolated)


# ----------------------------------------------------------------------------------------------------
# Sizes under a layout


class Sizer:
    """Per-device entries of a tensor of a given shape under a mesh and layout (mesh-tensorflow's own
    slice_shape, so an invalid layout fails here as it would when lowering)."""

    def __init__(self, mesh_shape: str, layout: str):
        self.mesh_shape, self.layout = mesh_shape, layout
        shape = mtf.convert_to_shape(mesh_shape)
        self.impl = mtf.placement_mesh_impl.PlacementMeshImpl(shape, mtf.convert_to_layout_rules(layout),
                                                              [""] * shape.size)
        self._cache: dict = {}

    def slice_entries(self, key: tuple) -> int:
        if key not in self._cache:
            shape = mtf.Shape([mtf.Dimension(n, s) for n, s in key])
            try:
                self._cache[key] = math.prod(self.impl.slice_shape(shape))
            except ValueError as e:
                raise ConfigError(f"layout {self.layout!r} on mesh {self.mesh_shape!r} cannot split the model's "
                                  f"tensor {shape}: {e}") from None
        return self._cache[key]


@dataclass
class Memory:
    """Bytes per device (activations: of one micro-batch)."""
    weights: float
    optimizer: float
    gradients: float
    accumulators: float          # float32 gradient sums across micro-batches (0 with one micro-batch)
    weight_casts: float
    activations_saved: float
    activations_working: float
    micro_batches: int = 1

    @property
    def activations(self) -> float:
        return self.activations_saved + self.activations_working

    @property
    def total(self) -> float:
        return self.weights + self.optimizer + self.gradients + self.accumulators + self.weight_casts + self.activations


def memory(facts: GraphFacts, cfg: GPTConfig, recompute: bool) -> Memory:
    """Per-device memory for cfg's mesh_shape and layout (facts may come from the same model on another
    layout: only shapes are read). Raises ConfigError if the layout cannot split one of the model's tensors."""
    sizer = Sizer(cfg.mesh_shape, cfg.layout)
    for key, _ in facts.all_tensors.groups:
        sizer.slice_entries(key)
    k = num_microbatches(cfg, cfg.train_batch_size)
    batch = cfg.train_batch_size // k
    largest_gradient = facts.largest_forward.largest(sizer, batch)
    if recompute:
        working = max((s.bytes(sizer, batch) for s in facts.layer_saved), default=0.0) + largest_gradient
    else:
        working = largest_gradient
    gradients = facts.gradients.bytes(sizer)
    return Memory(facts.weights.bytes(sizer), facts.optimizer.bytes(sizer), gradients, gradients if k > 1 else 0.0,
                  facts.weight_casts.bytes(sizer), facts.saved[recompute].bytes(sizer, batch), working, k)


@dataclass
class InferenceMemory:
    """Bytes per device for --eval or --predict: the weights and what one batch holds, no optimizer state and no
    gradients."""
    job: str                     # "eval" or "predict"
    batch_size: int
    weights: float
    weight_casts: float
    kv_cache: float              # predict with the kv cache: keys and values of every layer at n_ctx, and
                                 # its q/k/v weights stacked for the steps
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.weight_casts + self.kv_cache + self.activations


def inference_memory(facts: GraphFacts, cfg: GPTConfig, job: str) -> InferenceMemory:
    """Per-device memory of `job` ("eval": one eval_batch_size batch; "predict": predict_batch_size sequences
    of n_ctx) under cfg's mesh and layout, from the same per-tensor facts as training. A forward pass keeps
    nothing for a backward one: its peak is an op's input and output alive together, counted as twice the
    largest forward tensor at that batch. Raises ConfigError if the layout cannot split the batch."""
    if job not in ("eval", "predict"):
        raise ValueError(f"job must be 'eval' or 'predict', got {job!r}")
    sizer = Sizer(cfg.mesh_shape, cfg.layout)
    batch = cfg.eval_batch_size if job == "eval" else cfg.predict_batch_size
    activations = 2 * facts.largest_forward.largest(sizer, batch)
    kv_cache = 0.0
    if job == "predict" and cfg.kv_cache and incremental_unsupported(cfg) is None:
        cache = TensorSet()  # models/kv_cache.py: a key and a value tensor per layer, and its stacked q/k/v weights
        cache.add(mtf.Shape([mtf.Dimension("batch", batch), mtf.Dimension("memory_length", cfg.n_ctx),
                             mtf.Dimension("heads", cfg.n_head), mtf.Dimension("features_per_head", cfg.head_size)]),
                  facts.activation_itemsize, 2 * cfg.n_layer)
        cache.add(mtf.Shape([mtf.Dimension("embd", cfg.n_embd), mtf.Dimension("qkv", 3),
                             mtf.Dimension("heads", cfg.n_head * cfg.head_size)]), facts.activation_itemsize,
                  cfg.n_layer)
        kv_cache = cache.bytes(sizer)
    return InferenceMemory(job, batch, facts.weights.bytes(sizer), facts.weight_casts.bytes(sizer), kv_cache,
                           activations)


# ----------------------------------------------------------------------------------------------------
# Batching


# ----------------------------------------------------------------------------------------------------
# Smallest mesh


def candidate_layouts(cfg: GPTConfig, n_devices: int, max_model_parallel: Optional[int] = None) -> list:
    """(config on that mesh and layout, family) for n_devices, for the layouts that validate."""
    found = []

    def add(mesh_shape, layout, family):
        try:
            found.append((replace(cfg, mesh_shape=mesh_shape, layout=layout), family))
        except ConfigError:
            return

    if n_devices == 1:
        add("all:1", "", "one device")
        return found
    add(f"x:{n_devices}", "batch:x", "data parallel")
    add(f"x:{n_devices}", "heads:x,intermediate_expanded:x,vocab:x", "model parallel (heads, mlp, vocab)")
    add(f"x:{n_devices}", "embd:x,memory_length:x", "model parallel (embd, memory_length)")
    model = 2
    while model < n_devices and (max_model_parallel is None or model <= max_model_parallel):
        if n_devices % model == 0:
            mesh = f"x:{n_devices // model},y:{model}"
            add(mesh, "batch:x,heads:y,intermediate_expanded:y,vocab:y", "data x model (heads, mlp, vocab)")
            add(mesh, "batch:x,embd:y,memory_length:y", "data x model (embd, memory_length)")
            add(mesh, "batch:x,heads:y", "data x model (heads)")
        model *= 2
    return found


@dataclass
class Fit:
    n_devices: int
    mesh_shape: str
    layout: str
    family: str
    memory: Memory


def smallest_fit(cfg: GPTConfig, facts: GraphFacts, device_bytes: float, recompute: bool,
                 max_devices: int = 2 ** 16) -> Optional[Fit]:
    """The fewest devices (powers of two) with a candidate layout whose per-device total fits device_bytes;
    among those, the layout with the smallest total."""
    n = 1
    while n <= max_devices:
        best = None
        for candidate, family in candidate_layouts(cfg, n):
            try:
                m = memory(facts, candidate, recompute)
            except ConfigError:  # e.g. a split that a layer's internal tensors cannot take
                continue
            if m.total <= device_bytes and (best is None or m.total < best.memory.total):
                best = Fit(n, candidate.mesh_shape, candidate.layout, family, m)
        if best is not None:
            return best
        n *= 2
    return None


# ----------------------------------------------------------------------------------------------------
# The plan


@dataclass
class Plan:
    cfg: GPTConfig
    facts: GraphFacts
    formula: dict
    flops_per_token: float
    tokens_per_step: int
    micro_batches: int
    batch_per_replica: int
    memory: dict                     # recompute (bool) -> Memory under the config's mesh and layout
    device_bytes: Optional[float] = None
    fit: dict = field(default_factory=dict)  # recompute (bool) -> Optional[Fit]

    @property
    def params(self) -> dict:
        return self.facts.params


def make_plan(cfg: GPTConfig, device_memory: Optional[str] = None, facts: Optional[GraphFacts] = None) -> Plan:
    """The dry run of cfg, from the facts of its graph (`facts`: e.g. by_layer_kind's; default collect's)."""
    facts = facts or collect(cfg)
    split = batch_split(cfg)
    plan = Plan(cfg, facts, flops.parameter_count(cfg), flops.training_flops_per_token(cfg, facts.params),
                cfg.train_batch_size * cfg.n_ctx, num_microbatches(cfg, cfg.train_batch_size), cfg.train_batch_size // split,
                {flag: memory(facts, cfg, flag) for flag in (False, True)})
    if device_memory:
        plan.device_bytes = parse_bytes(device_memory)
        plan.fit = {flag: smallest_fit(cfg, facts, plan.device_bytes, flag) for flag in (False, True)}
    return plan


def _n(x: float) -> str:
    return f"{x:,.0f}"


def _short(x: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def describe(plan: Plan, name: str) -> str:
    cfg, p = plan.cfg, plan.params
    formula_note = ("the closed-form count agrees" if plan.formula["total"] == p["total"] else
                    f"the closed-form count for the default architecture says {_n(plan.formula['total'])}")
    recompute_flops = plan.flops_per_token * 4 / 3  # one more forward pass: 8N instead of 6N
    step_flops = plan.flops_per_token * plan.tokens_per_step
    run_tokens = plan.tokens_per_step * cfg.train_steps
    lines = [
        f"dry run for {name}: nothing is trained",
        f"  model          {cfg.n_layer} layers x {cfg.n_embd} wide, {cfg.n_head} heads, context {cfg.n_ctx}, "
        f"vocab {cfg.n_vocab}, precision {cfg.precision}, optimizer {cfg.opt_name}",
        f"  mesh / layout  {cfg.mesh_shape} ({cfg.n_devices} devices) / {cfg.layout or '(nothing split)'}",
        f"  parameters     {_n(p['total'])} ({_short(p['total'])}) total, {_n(p['non_embedding'])} non-embedding, "
        f"{_n(p['embedding'])} embedding (counted on the training graph; {formula_note})",
        f"  FLOPs/token    {plan.flops_per_token:.3e} for training (6N + attention; N counts the tied output "
        f"projection); {recompute_flops:.3e} executed with recompute_grad's second forward pass",
        f"  tokens/step    {_n(plan.tokens_per_step)} ({cfg.train_batch_size} sequences x {cfg.n_ctx}); "
        f"{step_flops:.3e} FLOPs per step",
        f"  micro-batches  {plan.micro_batches} per step, each {plan.batch_per_replica // plan.micro_batches} "
        f"sequences per replica ({plan.batch_per_replica} per replica per step, "
        f"{cfg.train_batch_size // plan.batch_per_replica} data-parallel replicas)",
        f"  whole run      {cfg.train_steps:,} steps = {_short(run_tokens)} tokens, {step_flops * cfg.train_steps:.3e} "
        f"FLOPs",
        "",
        f"  per-device memory (on GPUs: GPU memory) on {cfg.mesh_shape}, layout {cfg.layout or '(nothing split)'}:",
        f"  {'':52}{'recompute_grad off':>20}{'recompute_grad on':>20}",
    ]
    off, on = plan.memory[False], plan.memory[True]
    marks = {False: "", True: ""}
    marks[cfg.recompute_grad] = "  (config)"
    rows = [(f"weights ({_dtype_name(plan.facts.weights)})", off.weights, on.weights),
            (f"optimizer state ({cfg.opt_name})", off.optimizer, on.optimizer),
            ("gradients (float32)", off.gradients, on.gradients)]
    if off.accumulators:
        rows.append(("gradient sums over micro-batches", off.accumulators, on.accumulators))
    if off.weight_casts:
        rows.append((f"weight copies ({cfg.precision})", off.weight_casts, on.weight_casts))
    per = " (per micro-batch)" if plan.micro_batches > 1 else ""
    rows += [("activations kept for backward" + per, off.activations_saved, on.activations_saved),
             ("activations, backward working set", off.activations_working, on.activations_working),
             ("total", off.total, on.total)]
    for label, a, b in rows:
        lines.append(f"  {label:<52}{human_bytes(a):>20}{human_bytes(b):>20}")
    lines.append(f"  {'':52}{marks[False]:>20}{marks[True]:>20}".rstrip())
    configured = "on" if cfg.recompute_grad else "off"
    lines += [
        f"  host RAM       {human_bytes(host_memory(plan, cpu_devices=False))} on GPUs and TPUs: the master copies "
        f"of all variables, {cfg.opt_name} state included (spread over the hosts with --cluster or --tpu)",
        f"  host RAM       {human_bytes(host_memory(plan, cpu_devices=True))} on CPU devices: the master copies plus "
        f"{cfg.n_devices} x the total (recompute_grad {configured}), all in the CPU's RAM",
    ]
    for kind, size in (("eval_batch_size", cfg.eval_batch_size), ("predict_batch_size", cfg.predict_batch_size)):
        if size % batch_split(cfg):
            lines.append(f"  note: {kind} {size} does not divide over the {batch_split(cfg)}-way batch split: "
                         f"--eval/--predict need another --mesh_shape/--layout")
    if plan.device_bytes:
        lines.append("")
        current = plan.memory[cfg.recompute_grad].total
        verdict = "fits" if current <= plan.device_bytes else "does NOT fit"
        lines.append(f"  device memory {human_bytes(plan.device_bytes)}: this mesh and layout {verdict} "
                     f"({human_bytes(current)} with recompute_grad {'on' if cfg.recompute_grad else 'off'})")
        for flag in (cfg.recompute_grad, not cfg.recompute_grad):
            fit = plan.fit.get(flag)
            label = f"recompute_grad {'on' if flag else 'off'}"
            if fit is None:
                lines.append(f"  smallest mesh that fits, {label}: none up to 65,536 devices with the layouts tried "
                             f"(activations per sequence exceed the device: lower train_batch_size or n_ctx)")
            else:
                lines.append(f"  smallest mesh that fits, {label}: {fit.n_devices} devices, "
                             f"--mesh_shape {fit.mesh_shape} --layout {fit.layout or chr(39) * 2} "
                             f"({fit.family}; {human_bytes(fit.memory.total)} per device)")
        lines.append("  (layouts tried: data parallel, model parallel over heads/mlp/vocab or embd/memory_length, "
                     "and both; --auto_layout on the chosen mesh may find a leaner one)")
    return "\n".join(lines)


def host_memory(plan: Plan, cpu_devices: bool) -> float:
    """Host RAM a one-host run needs for variables and the training step: the master copies of all variables
    (master dtype, optimizer slots included); on CPU devices also every device's per-device total (the config's
    recompute_grad), since the CPU's logical devices are host RAM."""
    total = plan.facts.master_bytes
    if cpu_devices:
        total += plan.cfg.n_devices * plan.memory[plan.cfg.recompute_grad].total
    return total


def _dtype_name(tensors: TensorSet) -> str:
    sizes = {itemsize for (_, itemsize) in tensors.groups}
    return {4: "float32", 2: "bfloat16"}.get(sizes.pop(), "mixed") if len(sizes) == 1 else "mixed"
