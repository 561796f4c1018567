"""bench/bench_decode.py's own arithmetic: the median per-token time, the bytes a decoder must read per token and
the memory-bandwidth copy. The benchmark itself is not run here."""
import os
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
import bench_decode  # noqa: E402
import bench_train  # noqa: E402
from models import flops  # noqa: E402


def test_per_token_time_is_the_median_of_the_repeats_so_one_disturbed_repeat_does_not_move_it():
    times = {8: [1.0, 1.0, 1.0, 1.0, 1.0], 40: [1.32, 1.33, 1.32, 2.9, 1.31]}   # repeat 4 disturbed
    r = bench_decode.per_token(times, (8, 40))
    assert r["per_token_ms"] == pytest.approx(1e3 * 0.32 / 32)
    assert r["per_token_best_ms"] == pytest.approx(1e3 * 0.31 / 32)
    assert len(r["per_token_repeats_ms"]) == 5


def test_a_generations_cpu_seconds_are_the_median_of_the_repeats():
    """--prefill_bucket's whole-generation CPU seconds: the median per generation length (a mean would move with
    repeat 4's burst). Bug caught: N1's figure taken from N2's calls."""
    times = {8: [1.0] * 3, 40: [1.3] * 3}
    r = bench_decode.per_token(times, (8, 40), cpu={8: [0.5, 0.4, 0.6], 40: [0.9, 3.0, 0.8]})
    assert (r["cpu_n1_s"], r["cpu_n2_s"]) == (0.5, 0.9)
    assert "cpu_n1_s" not in bench_decode.per_token(times, (8, 40))


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


def test_auto_jit_modes_add_their_flags_and_a_changed_xla_flags_gets_its_own_compile_cache():
    """--auto_jit's worker environments (bench/worker.py): the clustering flags added to the user's, the XLA
    compile cache's folder kept where XLA_FLAGS stays, and dropped where a mode sets XLA_FLAGS, so the worker keys
    its own cache by them. Bug caught: the parent's cache folder kept for auto_jit+onednn (code compiled with
    oneDNN's flag would be loaded by runs without it, and the reverse)."""
    import worker
    parent = {"TF_XLA_FLAGS": "--tf_xla_min_cluster_size=4 --tf_xla_persistent_cache_directory=/c/key", "HOME": "/h"}
    assert worker.jit_environment("default", parent) == parent
    auto = worker.jit_environment("auto_jit", parent)
    assert auto["TF_XLA_FLAGS"].split() == worker.AUTO_JIT_FLAGS.split() + parent["TF_XLA_FLAGS"].split()
    assert "XLA_FLAGS" not in auto
    onednn = worker.jit_environment("auto_jit+onednn", dict(parent, XLA_FLAGS="--xla_cpu_enable_fast_math=false"))
    assert onednn["XLA_FLAGS"].split() == ["--xla_cpu_use_onednn=true", "--xla_cpu_enable_fast_math=false"]
    assert onednn["TF_XLA_FLAGS"].split() == worker.AUTO_JIT_FLAGS.split() + ["--tf_xla_min_cluster_size=4"]
    assert parent["TF_XLA_FLAGS"].endswith("/c/key")  # the parent's own environment untouched


def test_auto_jit_summary_takes_the_median_of_every_repeat_and_compares_tokens_and_cpu_with_the_default():
    """--auto_jit's table: per mode the median over every repeat of every round (one disturbed round does not
    move it), CPU ms per token from each round's N1 and N2 CPU seconds, and whether its greedy tokens were the
    default's. Bug caught: a mode's tokens compared with its own first round instead of the default's."""
    def run(repeats, cpu_n1, cpu_n2, tokens):
        return {"by_prompt": {"16": dict(per_token_repeats_ms=repeats, per_token_ms=sorted(repeats)[1],
                                         cpu_n1_s=cpu_n1, cpu_n2_s=cpu_n2, tokens=tokens)},
                "first_call_s": {"16/None/8": [2.0, 0.5], "16/None/40": [3.0, 0.5]}}
    runs = {"default": [run([4.0, 5.0, 6.0], 1.0, 1.32, [1, 2]), run([5.0, 5.5, 30.0], 1.0, 1.64, [1, 2])],
            "auto_jit": [run([8.0, 9.0, 10.0], 1.0, 1.96, [1, 3]), run([9.0, 9.5, 9.0], 1.0, 1.96, [1, 3])]}
    s = bench_decode.jit_summary(runs, (8, 40))
    assert s["default"]["16"]["per_token_ms"] == pytest.approx(5.25)   # median of the six repeats
    assert s["auto_jit"]["16"]["per_token_ms"] == pytest.approx(9.0)
    assert s["default"]["16"]["cpu_per_token_ms"] == pytest.approx(1e3 * (0.32 + 0.64) / 2 / 32)
    assert s["auto_jit"]["16"]["cpu_per_token_ms"] == pytest.approx(1e3 * 0.96 / 32)
    assert s["default"]["16"]["same_tokens"] and not s["auto_jit"]["16"]["same_tokens"]
    assert s["auto_jit"]["first_call_s"][0]["16/None/8"] == [2.0, 0.5]


def test_cpu_ms_a_token_is_the_difference_of_the_generations_cpu_seconds_over_the_extra_tokens():
    """The CPU figure the table prints beside the wall time (a shared machine stretches wall time, not CPU).
    Bug caught: N1's CPU seconds subtracted from themselves (0 ms a token)."""
    run = {"by_prompt": {"16": {"cpu_n1_s": 0.5, "cpu_n2_s": 0.82}}}
    assert bench_decode.cpu_ms(run, 16, 8, 40) == pytest.approx(10.0)


def test_the_cpu_ratio_takes_the_best_peer_and_skips_figures_noise_made_negative():
    """Bug caught: a peer's negative CPU figure (t(N2) below t(N1) on a loaded machine) taken as the best,
    which printed a negative ratio."""
    def run(n1, n2):
        return {"by_prompt": {"16": {"cpu_n1_s": n1, "cpu_n2_s": n2}}}
    ours, peers = run(0.5, 0.82), [run(1.0, 1.64), run(1.0, 0.5), run(1.0, 2.0)]
    assert bench_decode.cpu_ratio(ours, peers, 16, 8, 40) == "2.00x"
    assert bench_decode.cpu_ratio(ours, [run(1.0, 0.5)], 16, 8, 40) == "-"


def test_ours_headline_runs_in_what_auto_runs_a_trained_model_in_on_this_cpu():
    assert bench_decode.default_variants({"avx2", "avx512f", "avx512_bf16"}) == ["bfloat16", "float32"]
    assert bench_decode.default_variants({"avx2", "fma"}) == ["float32"]
