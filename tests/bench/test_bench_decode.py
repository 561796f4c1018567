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
