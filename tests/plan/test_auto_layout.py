"""--auto_layout and --auto_layout_and_mesh_shape: auto_mtf on the model's training graph."""
import json

import mesh_tensorflow as mtf
import numpy as np
import pytest
from mesh_tensorflow.auto_mtf import layout_optimizer

import main
from plan import auto_layout as layout_planner
from config import load_config, replace
from models.layout import tensor_dim_sizes
from tiny import compute_logits, devices_for, random_tokens, tiny_config


def _solve(planner, mesh_dims, aggregated: bool):
    mesh = mtf.Shape([mtf.Dimension(n, s) for n, s in mesh_dims])
    with planner.built.tf_graph.as_default():
        estimator = layout_planner._PlanningEstimator(planner.built.graph, mesh,
                                                      [planner.built.cross_entropy, planner.built.objective],
                                                      planner.allowed, graph_interface=planner.interface)
        if aggregated:
            optimizer = layout_planner._AggregatedLayoutOptimizer(estimator, planner.schedule)
        else:
            optimizer = layout_optimizer.LayoutOptimizer(estimator)
        solution = optimizer.solve()
        return solution, optimizer.evaluate_layout(solution), optimizer


@pytest.mark.parametrize("mesh_dims,recompute", [([("x", 2), ("y", 2)], False), ([("x", 4), ("y", 2)], True)])
def test_aggregated_constraints_keep_the_stock_optimum(mesh_dims, recompute):
    cfg = tiny_config(n_ctx=32, train_batch_size=8, recompute_grad=recompute)
    planner = layout_planner._Planner(cfg, None)
    # The whole training step is planned (recompute_grad's copies of the forward ops included).
    assert sorted(planner.schedule) == list(range(len(planner.built.graph.operations)))
    stock_layout, stock_peak, _ = _solve(planner, mesh_dims, aggregated=False)
    layout, peak, optimizer = _solve(planner, mesh_dims, aggregated=True)
    assert peak == stock_peak
    assert layout == stock_layout
    before, after = optimizer.memory_constraints
    assert 0 < after < before  # the same program with far fewer constraints


def test_layout_is_restricted_to_config_dimensions_and_lowers_to_the_same_logits():
    cfg = tiny_config()
    plan = layout_planner.auto_layout(cfg, mesh_shape="x:2,y:2")
    assert plan.mesh_shape == "x:2,y:2" and plan.planned_layers == cfg.n_layer
    planned = replace(cfg, mesh_shape=plan.mesh_shape, layout=plan.layout)  # validates as a config
    assert planned.layout_rules, "nothing was split on a 4-device mesh"
    assert {dim for dim, _ in planned.layout_rules} <= set(tensor_dim_sizes(cfg))
    tokens = random_tokens([cfg.train_batch_size, cfg.n_ctx], seed=7)
    reference = compute_logits(cfg, tokens, devices_for(cfg))
    np.testing.assert_allclose(compute_logits(planned, tokens, devices_for(planned)), reference, atol=1e-5)


def test_mesh_shape_candidates():
    assert layout_planner.mesh_shape_candidates(1) == [[1]]
    assert layout_planner.mesh_shape_candidates(8) == [[8], [4, 2]]
    assert layout_planner.mesh_shape_candidates(16) == [[16], [8, 2], [4, 4]]
    assert layout_planner.mesh_shape_candidates(12) == [[12], [6, 2], [4, 3]]
    assert layout_planner.mesh_shape_candidates(8, max_dims=3) == [[8], [4, 2], [2, 2, 2]]


def test_layout_and_mesh_shape_picks_the_lowest_peak_over_every_mesh():
    cfg = tiny_config(train_batch_size=8)
    plan = layout_planner.auto_layout_and_mesh_shape(cfg, 4)
    assert [c[0] for c in plan.candidates] == ["x:4", "x:2,y:2"]
    assert plan.peak_bytes == min(c[2] for c in plan.candidates)
    chosen = replace(cfg, mesh_shape=plan.mesh_shape, layout=plan.layout)
    assert chosen.n_devices == 4
    one = layout_planner.auto_layout_and_mesh_shape(cfg, 1)
    assert (one.mesh_shape, one.layout) == ("all:1", "")


@pytest.mark.parametrize("name", ["colab_XL", "gpt3_13B"])
def test_shipped_configs_plan_on_their_real_dimensions(name):
    # The whole-model timings are in docs/measured.md (Planning time); here the first two layers (same dimensions) keep it fast.
    cfg = load_config(name)
    plan = layout_planner.auto_layout(cfg, n_layer=2)
    assert plan.planned_layers == 2 and plan.n_layer == cfg.n_layer
    planned = replace(cfg, mesh_shape=plan.mesh_shape, layout=plan.layout)  # loads and validates
    assert planned.mesh_shape == cfg.mesh_shape
    assert bool(planned.layout_rules) == (cfg.n_devices > 1)
    assert "first 2 of" in layout_planner.describe(plan, name, with_mesh=False)


def test_cli_prints_the_layout_and_writes_a_config_copy(tmp_path, capsys):
    source = tmp_path / "small.json"
    source.write_text(json.dumps(dict(n_layer=2, n_embd=32, n_head=4, n_vocab=64, n_ctx=16, train_batch_size=8,
                                      mesh_shape="x:2,y:2", layout="batch:x,heads:y", lr=0.001)))
    out = tmp_path / "planned" / "small_auto.json"
    assert main.main(["--model", str(source), "--auto_layout_and_mesh_shape", "--num_devices", "8",
                      "--write_config", str(out)]) == 0
    printed = capsys.readouterr().out
    written = json.loads(out.read_text())
    assert f'"mesh_shape": "{written["mesh_shape"]}"' in printed and f'"layout": "{written["layout"]}"' in printed
    assert f"--mesh_shape {written['mesh_shape']} --layout" in printed
    assert written["lr"] == 0.001 and written["n_layer"] == 2  # the rest of the config is kept
    planned = load_config(str(out))
    assert planned.n_devices == 8
    assert "x:8" in printed and "x:4,y:2" in printed  # every mesh tried is listed

    # --auto_layout keeps the mesh (even a --mesh_shape the config's layout would not fit) and trains nothing.
    assert main.main(["--model", str(source), "--auto_layout", "--mesh_shape", "x:8"]) == 0
    printed = capsys.readouterr().out
    assert '"mesh_shape": "x:8"' in printed and "step" not in printed
