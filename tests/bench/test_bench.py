"""The benchmarks' own arithmetic (bench/): bench_train's shapes, bench_decode's median per-token time, the bytes
a decoder must read per token and the memory-bandwidth copy. The benchmarks themselves are not run here."""
import os
import re
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
import bench_decode  # noqa: E402
import bench_train  # noqa: E402
from models import flops  # noqa: E402
from models.attention import ATTENTION  # noqa: E402


def test_the_neo_shape_is_gpt_neos_context_window_and_batch_and_flags_override_it():
    default, neo = bench_train.parse([]), bench_train.parse(["--shape", "neo"])
    assert (default.n_ctx, default.window, default.batch) == (256, 128, 8)
    assert (neo.n_ctx, neo.window, neo.batch) == (2048, 256, 1)
    assert bench_train.parse(["--shape", "neo", "--batch", "2"]).batch == 2
    cfg = bench_train.bench_config(bench_train.model_args(neo), model_path="run")
    assert cfg.attention_types == ("global", "local") * 3 and cfg.local_attention_radius == 256
    # MFU counts the keys each query really sees: a local layer's window, not the whole context
    assert ATTENTION["local"].keys_per_query(cfg) == 256 < ATTENTION["global"].keys_per_query(cfg) == 1024


def test_per_token_time_is_the_median_of_the_repeats_so_one_disturbed_repeat_does_not_move_it():
    times = {8: [1.0, 1.0, 1.0, 1.0, 1.0], 40: [1.32, 1.33, 1.32, 2.9, 1.31]}   # repeat 4 disturbed
    r = bench_decode.per_token(times, (8, 40))
    assert r["per_token_ms"] == pytest.approx(1e3 * 0.32 / 32)
    assert r["per_token_best_ms"] == pytest.approx(1e3 * 0.31 / 32)
    assert len(r["per_token_repeats_ms"]) == 5


def test_bytes_per_token_are_every_weight_once_and_the_cache_each_layer_reads():
    args = SimpleNamespace(n_layer=2, n_embd=32, n_vocab=64, window=4, n_head=4)
    cfg = bench_train.bench_config(dict(n_layer=2, n_embd=32, n_head=4, n_ctx=16, n_vocab=64, batch=1, window=4),
                                   model_path="run")
    params = flops.parameter_count(cfg)
    weights = 4 * (params["non_embedding"] + 64 * 32)   # the tied embedding read once for the logits
    assert bench_decode.bytes_per_token(args, 0) == weights + 4 * 2 * 32 * (1 + 1)
    # at position 9 the global layer reads 10 keys and values, the local one its window of 4
    assert bench_decode.bytes_per_token(args, 9) == weights + 4 * 2 * 32 * (10 + 4)


def test_the_copy_bandwidth_is_a_plausible_rate():
    r = bench_decode.copy_bandwidth(megabytes=8, repeats=2)
    assert 1e8 < r["copy_bytes_per_s"] <= r["copy_best_bytes_per_s"] < 1e13


PROJECTIONS, LOGITS, ATTENTION_MATMULS = "matmul: projections", "matmul: output logits (tied embedding)", "matmul: attention"
OPTIMIZER, BIAS_GRADIENTS = "optimizer (Adam, clipping)", "bias gradients (sums)"
TINY = dict(n_layer=2, n_embd=32, n_head=4, n_ctx=16, n_vocab=64, batch=2, window=4)


@pytest.fixture(scope="module")
def traced_step(tmp_path_factory):
    """What bench/profile_train.py reads of one training step of a tiny model, traced as it traces (its
    timeline_ops: op type, node name, ms), with the config and the model's variable names."""
    import numpy as np
    import tensorflow.compat.v1 as tf

    import profile_train
    from conftest import CPU_DEVICES
    from execution import meshes
    from devices.placement import Placement
    from execution.mesh_session import MeshSession
    from train.step import training_step

    cfg = bench_train.bench_config(TINY, model_path=str(tmp_path_factory.mktemp("profile") / "run"))
    placement = Placement(devices=tuple(CPU_DEVICES[:1]))
    data = np.random.RandomState(0).randint(0, cfg.n_vocab, size=[cfg.train_batch_size, cfg.n_ctx + 1]).astype(np.int32)
    graph = tf.Graph()
    with graph.as_default(), tf.device(placement.device_function()):
        mesh, impl = meshes.placement_mesh(cfg, placement)
        lowered = training_step(cfg, mesh, impl, tf.constant(data[:, :-1]), tf.constant(data[:, 1:]))
    variables = [v.name for v in mesh.graph.trainable_variables]
    with MeshSession(graph, lowered.lowering, "", placement.session_config(), None) as session:
        session.run(lowered.train_op)
        metadata = tf.RunMetadata()
        session.session.run(lowered.train_op, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
                            run_metadata=metadata)
    return profile_train.timeline_ops(metadata), cfg, variables


@pytest.mark.slow
def test_the_profile_sorts_each_op_of_a_real_training_step_into_its_part_of_the_model(traced_step):
    """The categories are read off the lowered graph's scopes, which move when the model's kernels do. On a real
    step's timeline (not names written for the test): bugs caught, each seen in the script, are the clipping's
    sums of squares (an L2Loss per gradient: train/optimizer.SumOfSquares) not counted as the optimizer's,
    the bias and LayerNorm gradients' products with ones counted as projections, oneDNN's _MklTranspose
    counted as other instead of copies, and grappler's .../ArithmeticOptimizer/... rewrites inside the layers
    counted as the optimizer."""
    import profile_train as p
    ops, cfg, variables = traced_step
    sorted_ops = {}
    for op_type, name, _ in ops:
        sorted_ops.setdefault(p.tf_category(op_type, name), []).append((op_type, name))
    assert set(sorted_ops) <= set(p.CATEGORIES)
    assert set(p.CATEGORIES) - {"other"} <= set(sorted_ops), set(p.CATEGORIES) - set(sorted_ops)

    def matmuls(category):
        return [name for op_type, name in sorted_ops.get(category, []) if op_type in p.MATMULS]

    # the optimizer's ops are outside the model: grappler's rewrites inside it (LayerNorm's squares, the residual
    # adds, named .../ArithmeticOptimizer/...) are not the optimizer's
    assert sorted_ops[OPTIMIZER] and not [name for _, name in sorted_ops[OPTIMIZER] if name.startswith("gpt2/")]
    assert len(matmuls(LOGITS)) == 3  # the tied embedding's product and its two gradients
    assert len(matmuls(ATTENTION_MATMULS)) == 2 * 3 * cfg.n_layer  # q.k and weights.v of each layer, each with two gradients
    assert all(re.match(r"gpt2/h\d+/attn/attention/", name) for name in matmuls(ATTENTION_MATMULS)), matmuls(ATTENTION_MATMULS)
    # The projections are the layers' weight products, of attention and MLP in every layer, and nothing else.
    parts = set()
    for name in matmuls(PROJECTIONS):
        scope = re.match(r"gpt2/h(\d+)/(attn|mlp)/", name)
        assert scope and "/attention/" not in name and "bias_add" not in name and "norm" not in name, name
        parts.add(scope.groups())
    assert parts == {(str(layer), part) for layer in range(cfg.n_layer) for part in ("attn", "mlp")}
    # The clipping's global norm: one sum of squares (an L2Loss) per gradient, each counted as the optimizer's.
    assert len([name for op_type, name in sorted_ops[OPTIMIZER] if op_type == "L2Loss"]) == len(variables)
    # Each bias's gradient: one product with a row of ones.
    assert len(matmuls(BIAS_GRADIENTS)) == len([v for v in variables if re.search(r"(bias|/o_b)$", v)])
    assert not matmuls("other") and not matmuls("copies (transpose, reshape, cast, concat)")
    # A layer's computing ops are all in a category of their own; only variable bookkeeping and the residual
    # stream's gradient sums (gpt2/hN/add_N: the skip's gradient plus the branch's) are "other".
    bookkeeping = {"VarHandleOp", "ReadVariableOp", "Const", "NoOp"}
    unsorted = [(op_type, name) for op_type, name in sorted_ops.get("other", [])
                if re.match(r"gpt2/h\d+/", name) and op_type not in bookkeeping
                and not re.match(r"gpt2/h\d+/add(_\d+)*/", name)]
    assert not unsorted, unsorted


def test_the_hf_worker_trains_and_reports_its_wall_and_cpu_seconds(monkeypatch):
    """bench_train.py's HF side (worker_hf) on a tiny GPTNeo trains a few steps and reports tokens/s and the
    process's CPU seconds per step as ours does. Bug caught: the CPU clock not read in its loop
    (a NameError on every HF run, which left bench_memory.py without a peer)."""
    import bench_train
    import torch
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # this process's torch keeps its threads
    args = SimpleNamespace(**TINY, warmup=1, steps=3, precision="float32", peak_size=64, peak_seconds=0.05)
    result = bench_train.worker_hf(args)
    assert result["tokens_per_s"] > 0 and result["cpu_s_per_step"] > 0 and len(result["step_times"]) == 3
    assert 0 < result["first_loss"] < 10 and 0 < result["last_loss"] < 10  # about ln(64) = 4.2 at the start


def test_the_profile_sorts_each_op_of_a_real_hf_step(monkeypatch):
    """HF's side on a real profiled step of a tiny GPTNeo (profile_train.worker_hf): every op lands in a category
    of the breakdown, each part of the model gets its ops, and no matrix product is counted as other or copies."""
    import profile_train as p
    import torch
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # this process's torch keeps its threads
    args = SimpleNamespace(**TINY, warmup=0, steps=1, top=10 ** 6, precision="float32")
    events = p.worker_hf(args)["top"]  # [category, phase, op name, ms] of every (category, phase, name)
    categories = {category for category, _, _, _ in events}
    assert categories <= set(p.CATEGORIES)
    expected = {PROJECTIONS, LOGITS, ATTENTION_MATMULS, "attention: softmax, mask", "LayerNorm", "GELU", "loss", OPTIMIZER,
                "embedding gradient"}
    assert expected <= categories, expected - categories
    products = [(category, phase) for category, phase, name, _ in events
                if re.search(r"aten::(mm|addmm|bmm|baddbmm|matmul|linear)$", name)]
    assert products and all(category in (PROJECTIONS, LOGITS, ATTENTION_MATMULS) or phase in ("hf_optimizer", "hf_clip")
                            for category, phase in products), products
    # The output layer's product runs forward and backward.
    assert {phase for category, phase, _, _ in events if category == LOGITS} == {"hf_forward", "hf_backward"}


def test_the_125m_shape_is_gpt_neo_125ms_own_config():
    """The bug it guards: a 125m shape that is not the released model's (e.g. 6 layers, or vocab 8192)."""
    a = bench_train.parse(["--shape", "125m"])
    assert (a.n_layer, a.n_embd, a.n_head, a.n_vocab, a.n_ctx, a.window, a.batch) == (12, 768, 12, 50257, 2048, 256, 1)
    cfg = bench_train.bench_config(bench_train.model_args(a), model_path="run")
    assert cfg.attention_types == ("global", "local") * 6
    assert 124e6 < flops.parameter_count(cfg)["total"] < 126e6


def _run(tokens_per_s, precision="float32"):
    return {"tokens_per_s": tokens_per_s, "step_s": 1.0, "flops_per_token": 1e9, "peak_rss": 2 ** 30}


def test_the_headline_is_ours_in_autos_precision_over_the_best_peer_and_mfu_uses_the_peak_of_the_precision_run():
    """The bugs it guards: a bf16 step's MFU against the fp32 peak (flattering by the peaks' ratio), and a headline
    against one fixed peer (HF eager fp32) rather than the fastest one measured."""
    peaks = [{"fp32_matmul_flops": 100e9, "bf16_matmul_flops": 400e9}, {"fp32_matmul_flops": 90e9,
                                                                          "bf16_matmul_flops": 380e9}]
    ours = {"float32": [_run(60)], "bfloat16": [_run(200), _run(300)]}
    hf = {"float32": [_run(50)], "bfloat16+compile": [_run(150)], "float32+compile": [_run(70)]}
    s = bench_train.summarize(peaks, ours, hf, auto="bfloat16")
    rows = {r["name"]: r for r in s["rows"]}
    assert rows["ours bfloat16 (auto)"]["mfu"] == pytest.approx(300 * 1e9 / 400e9)
    assert rows["ours float32"]["mfu"] == pytest.approx(60 * 1e9 / 100e9)
    assert rows["HF compile bfloat16"]["mfu"] == pytest.approx(150 * 1e9 / 400e9)
    assert s["best_peer"] == "HF compile bfloat16" and s["ratio"] == pytest.approx(2.0)
    import measure
    table = measure.train_table([dict(s, shape="neo", model=bench_train.SHAPES["neo"])])
    assert "**2.00x** (HF compile bfloat16)" in table and "not met (≥ 2.5x)" in table


def test_a_run_over_the_memory_budget_is_stopped_and_one_within_it_reports_its_result():
    """The bug it guards: the memory bench's watch not stopping a worker that passes the budget (the machine
    would swap or the kernel kill something else)."""
    import bench_memory
    hog = [sys.executable, "-c", "import time; b = b'x' * (400 << 20); time.sleep(30)"]
    result, highest, status = bench_memory.run_watched(hog, budget=200 << 20, interval=0.02)
    assert (result, status) == (None, "over budget") and highest > 200 << 20
    fine = [sys.executable, "-c", f"print({bench_train.MARK!r} + '{{\"tokens_per_s\": 5}}')"]
    assert bench_memory.run_watched(fine, budget=200 << 20) == ({"tokens_per_s": 5}, pytest.approx(0, abs=200 << 20),
                                                                 "ok")


def test_the_memory_and_decode_tables_compare_with_the_best_peer():
    """The bugs they guard: the memory ratio against a peer that is not the one reaching the longest context,
    and the decode ratio against a peer that is not the fastest at that prompt."""
    import measure
    ok = lambda c: dict(n_ctx=c, status="ok", peak_rss=2 ** 30, tokens_per_s=100.0)  # noqa: E731
    over = lambda c: dict(n_ctx=c, status="over budget")  # noqa: E731
    import bench_memory
    s = dict(sides=["ours", "HF eager", "HF compile"], budget=24 * 2 ** 30,
             runs={"ours": [ok(512), ok(1024)], "HF eager": [ok(512), over(1024)], "HF compile": [ok(512), ok(1024)]},
             limits={"ours": dict(longest=8192, bounded=True), "HF eager": dict(longest=512, bounded=True),
                     "HF compile": dict(longest=2048, bounded=True)})
    s["best_peer"] = bench_memory.longest_peer(s["limits"], ["HF eager", "HF compile"])
    assert "**4.0x**" in measure.memory_table(s, None)
    s["limits"]["HF compile"]["bounded"] = False   # it trained every context tried: no ratio to claim
    assert "not determined" in measure.memory_table(s, None)
    decode = dict(prompt_lengths=[16, 256], runs=[
        {"measure": "ours float32", "by_prompt": {"16": {"per_token_ms": 5.0}, "256": {"per_token_ms": 6.0}}},
        {"measure": "HF eager float32", "by_prompt": {"16": {"per_token_ms": 10.0}, "256": {"per_token_ms": 9.0}}},
        {"measure": "HF compile bfloat16", "by_prompt": {"16": {"per_token_ms": 8.0}, "256": {"per_token_ms": 12.0}}}])
    assert "| **ours / best peer** | **1.60x** | **1.50x** |" in measure.decode_table(decode)


def test_measure_names_the_commit_it_started_on_not_the_one_its_own_plot_dirtied(monkeypatch, tmp_path):
    """The bug it guards: measure.py reading the commit after the run, when the memory plot it writes into docs/
    makes the checkout look changed, so a clean run's tables say "with uncommitted changes"."""
    import measure
    states = iter(["abc1234", "abc1234 (with uncommitted changes)"])
    monkeypatch.setattr(measure, "commit", lambda: next(states))
    peaks = [{"fp32_matmul_flops": 100e9, "bf16_matmul_flops": 400e9}]
    s = bench_train.summarize(peaks, {"float32": [_run(60)]}, {"float32": [_run(50)]}, auto="float32")
    s.update(shape="bench", model=bench_train.SHAPES["bench"], cpu="a CPU")
    monkeypatch.setattr(measure.bench_train, "measure", lambda args: s)
    monkeypatch.setattr(measure.bench_train, "print_table", lambda *a: None)
    out = tmp_path / "measured.md"
    assert measure.main(["--only", "train", "--shapes", "bench", "--out", str(out)]) == 0
    assert "commit abc1234;" in out.read_text()


def test_startup_bench_times_the_first_result_line_and_the_lines_before_it():
    """bench_startup's timed_run: the first line matching the job's pattern is the first result; lines before it
    are kept, with the longest silence among them."""
    import bench_startup
    code = "import time; print('loading ...'); time.sleep(0.3); print('======== sample 0'); print('after')"
    r = bench_startup.timed_run([sys.executable, "-c", code], bench_startup.FIRST_RESULT["predict"])
    assert r["returncode"] == 0 and r["first_s"] >= 0.3 and r["first_cpu_s"] is not None
    assert [line for _, line in r["lines_before"]] == ["loading ..."]
    assert r["longest_silence_s"] >= 0.3
