"""The benchmarks' own arithmetic (bench/): bench_train's shapes, bench_decode's median per-token time, the bytes
a decoder must read per token and the memory-bandwidth copy. The benchmarks themselves are not run here."""
import os
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
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


def test_the_profile_sorts_timeline_ops_into_the_breakdowns_categories():
    import profile_train as p
    assert p.tf_category("MatMul", "gpt2/wte_final_einsum/matmul/gradients/matmul_1/parallel_0/MatMul") == \
        "matmul: output logits (tied embedding)"
    assert p.tf_category("MatMul", "gpt2/h3/mlp/conv1d_main/c_fc/matmul/parallel_0/MatMul") == "matmul: projections"
    assert p.tf_category("Einsum", "gpt2/h0/attn/attention/einsum_1/parallel_0/einsum/Einsum") == "matmul: attention"
    assert p.tf_category("Softmax", "gpt2/h0/attn/attention/softmax/parallel_0/Softmax") == "attention: softmax, mask"
    assert p.tf_category("Transpose", "gpt2/h0/attn/attention/transpose_2/parallel_0/transpose") == \
        "copies (transpose, reshape, cast, concat)"
    assert p.tf_category("StatefulPartitionedCall", "adam_11/parallel_0/StatefulPartitionedCall") == \
        "optimizer (Adam, clipping)"
    assert p.tf_category("PartitionedCall", "xentropy_final/xent_log_z/parallel_0/PartitionedCall") == "loss"
    assert p.tf_category("UnsortedSegmentSum", "gpt2/token_embd/gather/gradients/gather_grad/parallel_0/X") == \
        "embedding gradient"
    assert p.tf_category("PartitionedCall", "gpt2/h1/mlp/gelu/gradients/gelu_grad/parallel_0/PartitionedCall") == "GELU"
    # HF: the same op is a logits or a projection matmul by its shapes, GELU or a residual add by its width
    assert p.torch_category("aten::mm", "hf_backward", [[2048, 8192], [8192, 512]], 8192, 512) == \
        "matmul: output logits (tied embedding)"
    assert p.torch_category("aten::addmm", "hf_forward", [[2048], [2048, 512], [512, 2048]], 8192, 512) == \
        "matmul: projections"
    assert p.torch_category("aten::mul", "hf_forward", [[8, 256, 2048], []], 8192, 512) == "GELU"
    assert p.torch_category("aten::add", "hf_forward", [[8, 256, 512], [8, 256, 512]], 8192, 512) == "other"
    assert p.torch_category("aten::mul_", "hf_optimizer", [[512]], 8192, 512) == "optimizer (Adam, clipping)"


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
