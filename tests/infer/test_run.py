"""infer/run.py's Predictor: what it says before a wait, one copy of the weights for all its programs (the
outputs themselves: tests/scenarios/test_predict_export.py)."""
import dataclasses
from typing import ClassVar

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from devices.placement import Placement
from execution import runner
from infer import run
from models.sampling import SamplingOptions
from tiny import checkpoint_of_order_one_weights, placement_for, random_tokens, tiny_config


class Built(Exception):
    """Raised in place of building the program: the test stops there."""


def test_the_label_line_comes_before_the_graph_is_built(monkeypatch, capsys):
    """The bug this catches: the "building the graph" line printed after `_program` (or not at all), so the console
    stays silent through the graph's build, the restore and the first call's optimisation."""
    printed_before_build = []

    def program(self, rows, batch_size, options):
        printed_before_build.append(capsys.readouterr().out)
        raise Built

    monkeypatch.setattr(run.Predictor, "_program", program)
    predictor = run.Predictor(cfg=None, placement=None, checkpoint="/runs/m/model.ckpt-20")
    with pytest.raises(Built):
        predictor.predict({"tokens": np.zeros([1, 8], np.int32)}, 1, label="sampling 1 x 96 new tokens")
    assert printed_before_build == ["sampling 1 x 96 new tokens: building the graph, restoring model.ckpt-20 ...\n"]


def test_without_a_label_nothing_is_printed(monkeypatch, capsys):
    monkeypatch.setattr(run.Predictor, "_program", lambda *a: (_ for _ in ()).throw(Built()))
    with pytest.raises(Built):
        run.Predictor(cfg=None, placement=None).predict({"tokens": np.zeros([1, 8], np.int32)}, 1)
    assert capsys.readouterr().out == ""


# --- one copy of the weights for every program of a Predictor ----------------------------------------------------

MESHES = {"1 device": dict(mesh_shape="all:1", layout=""), "2 devices": dict(mesh_shape="x:2", layout="heads:x")}


def scoring_rows(cfg, length):
    return {"tokens": random_tokens([3, length], vocab=cfg.n_vocab, seed=length),
            "targets": random_tokens([3, length], vocab=cfg.n_vocab, seed=length + 1)}


def prompt_rows(cfg):
    return {"tokens": random_tokens([2, cfg.n_ctx], vocab=cfg.n_vocab, seed=5),
            "prompt_length": np.array([3, 6], np.int32), "seed": np.array([1, 2], np.int32)}


def weight_shapes(checkpoint) -> list:
    return [shape for name, shape in tf.train.list_variables(checkpoint) if name != "global_step"]


def greedy(cfg):
    return SamplingOptions.from_config(cfg, max_new_tokens=3, temperature=0.0)


def run_kinds(predictor, cfg) -> list:
    """The outputs of three kinds of rows: scores of 8 and of n_ctx tokens, greedy samples."""
    return [predictor.predict(scoring_rows(cfg, 8), 3), predictor.predict(scoring_rows(cfg, cfg.n_ctx), 3),
            predictor.predict(prompt_rows(cfg), 2, greedy(cfg))]


def assert_same_outputs(got: list, want: list) -> None:
    """Tokens and counts equal; losses to float32 rounding (with 2 devices the slices' partial sums may add up in
    another order: 1 ulp apart, seen)."""
    for got_kind, want_kind in zip(got, want, strict=True):
        assert got_kind.keys() == want_kind.keys()
        for name in want_kind:
            if want_kind[name].dtype.kind == "f":
                np.testing.assert_allclose(got_kind[name], want_kind[name], rtol=1e-6, err_msg=name)
            else:
                np.testing.assert_array_equal(got_kind[name], want_kind[name], err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES.values(), ids=MESHES.keys())
def test_the_programs_of_a_predictor_hold_one_copy_of_the_weights(mesh, monkeypatch, tmp_path):
    """Three programs (scores of two lengths, greedy samples) from one Predictor: one session opened, its graph's
    variables exactly those of one program alone (with 2 devices: the masters and both devices' slices, once), and
    each program's outputs equal to a Predictor of its own. With 2 devices (masters and slices apart) the Predictor
    is first run at another checkpoint and restored: its outputs then are a fresh Predictor's at the second, and
    differ from the first's. Bugs caught: the later builds not finding the first's variables (runner.Program's
    reuse off: "already exists"); each program in a graph and session of its own again (three copies: three
    sessions opened); `restore` skipping the shared session, or restoring the masters without copying them to the
    slices the later programs read; the predictor's session opened as one that saves (saves=False dropped in
    Predictor._program: the finiteness check's ops built for every variable)."""
    cfg = tiny_config(**mesh)
    placement = placement_for(cfg)
    checkpoint = checkpoint_of_order_one_weights(cfg, str(tmp_path / "model.ckpt-1"), seed=0)
    earlier = checkpoint_of_order_one_weights(cfg, str(tmp_path / "model.ckpt-0"), seed=1) if cfg.n_devices > 1 else None
    opened = []
    program_open = runner.Program.open
    monkeypatch.setattr(runner.Program, "open", lambda self, *a, **k: opened.append(self) or program_open(self, *a, **k))
    with run.Predictor(cfg, placement, earlier or checkpoint) as shared:
        if earlier:
            at_earlier = run_kinds(shared, cfg)
            shared.restore(checkpoint)
        outputs = run_kinds(shared, cfg)
        shared_bytes = shared.variable_bytes()
        graphs = {id(program.graph) for program, _ in shared._programs.values()}
        graph = next(iter(shared._programs.values()))[0].graph
        variables = runner.variable_names(graph)
    assert len(opened) == 1 and len(graphs) == 1
    assert not [op for op in graph.get_operations() if op.type == "IsFinite"]  # a session that never saves
    alone = []
    for kind, (rows, batch, options) in enumerate([(scoring_rows(cfg, 8), 3, None),
                                                  (scoring_rows(cfg, cfg.n_ctx), 3, None),
                                                  (prompt_rows(cfg), 2, greedy(cfg))]):
        with run.Predictor(cfg, placement, checkpoint) as own:
            alone.append(own.predict(rows, batch, options))
            if kind == 0:
                one_model = own.variable_bytes()
                assert runner.variable_names(next(iter(own._programs.values()))[0].graph) == variables
    assert shared_bytes == one_model
    if cfg.n_devices == 1:  # the slice is the master: the weights' float32 bytes, once
        assert shared_bytes == 4 * sum(np.prod(shape) for shape in weight_shapes(checkpoint))
    assert_same_outputs(outputs, alone)
    if earlier:
        assert not np.allclose(at_earlier[0]["token_loss"], outputs[0]["token_loss"])
        assert not np.allclose(at_earlier[1]["token_loss"], outputs[1]["token_loss"])


@dataclasses.dataclass(frozen=True)
class UnsharedPlacement(Placement):
    """This host's devices, answering as a TPU's placement does: programs keep their own weights."""
    programs_share_weights: ClassVar[bool] = False


def test_a_placement_whose_programs_cannot_share_keeps_a_graph_and_session_per_program(tmp_path):
    """Where the placement says its programs cannot share the weights (a TPU's replicated loops), each program
    keeps today's graph, session and copy of its own, with the same outputs. Bug caught: the Predictor sharing
    whatever the placement says."""
    cfg = tiny_config()
    checkpoint = checkpoint_of_order_one_weights(cfg, str(tmp_path / "model.ckpt-1"))
    with run.Predictor(cfg, UnsharedPlacement(devices=placement_for(cfg).devices), checkpoint) as unshared:
        short, whole = unshared.predict(scoring_rows(cfg, 8), 3), unshared.predict(scoring_rows(cfg, cfg.n_ctx), 3)
        graphs = {id(program.graph) for program, _ in unshared._programs.values()}
        held = unshared.variable_bytes()
    assert len(graphs) == 2
    assert held == 2 * 4 * sum(np.prod(shape) for shape in weight_shapes(checkpoint))
    with run.Predictor(cfg, placement_for(cfg), checkpoint) as shared:
        assert_same_outputs([short, whole], [shared.predict(scoring_rows(cfg, 8), 3),
                                             shared.predict(scoring_rows(cfg, cfg.n_ctx), 3)])


def test_a_later_program_that_creates_variables_is_refused_naming_them():
    """A Predictor's later programs must find every weight in the shared session: one that creates a variable the
    first lacks (here a model whose output projection is untied, `no_weight_tie`, built after the tied model's
    first program) is refused in one line naming the variables, and nothing is kept of it. Bug caught: the check
    of `program.created_variables` dropped from `Predictor._program`, so the program runs on an uninitialised
    variable (TensorFlow's FailedPreconditionError, or a TPU's garbage) instead."""
    cfg = tiny_config()
    with run.Predictor(cfg, placement_for(cfg)) as predictor:
        predictor.predict(scoring_rows(cfg, 8), 3)
        (first, _), = predictor._programs.values()
        tied = runner.variable_names(first.graph)
        predictor.cfg = dataclasses.replace(cfg, no_weight_tie=True)  # another model in the same Predictor
        with pytest.raises(RuntimeError, match="created variables the first one lacks") as refused:
            predictor.predict(scoring_rows(cfg, cfg.n_ctx), 3)
        created = sorted(runner.variable_names(first.graph) - tied)
        assert created and ", ".join(created[:3]) in str(refused.value)
        assert len(predictor._programs) == 1


@pytest.mark.slow
def test_on_a_tensorflow_that_cannot_reopen_a_graph_each_program_keeps_its_own(monkeypatch, tmp_path):
    """Without Graph._unsafe_unfinalize (runner.GRAPHS_REOPEN false; tests/test_tensorflow_internals.py fails
    loudly there) a Predictor degrades to a graph and session per program, as on a TPU, with the same outputs.
    Bug caught: `Predictor._program` sharing the graph whatever GRAPHS_REOPEN says (its second program refused by
    runner.unfinalized)."""
    cfg = tiny_config()
    checkpoint = checkpoint_of_order_one_weights(cfg, str(tmp_path / "model.ckpt-1"))
    with run.Predictor(cfg, placement_for(cfg), checkpoint) as shared:
        want = [shared.predict(scoring_rows(cfg, 8), 3), shared.predict(scoring_rows(cfg, cfg.n_ctx), 3)]
    monkeypatch.setattr(runner, "GRAPHS_REOPEN", False)
    with run.Predictor(cfg, placement_for(cfg), checkpoint) as alone:
        got = [alone.predict(scoring_rows(cfg, 8), 3), alone.predict(scoring_rows(cfg, cfg.n_ctx), 3)]
        graphs = {id(program.graph) for program, _ in alone._programs.values()}
    assert len(graphs) == 2
    assert_same_outputs(got, want)
