"""bench/measure.py's tables (the memory and decode ratios against the best peer) and the commit it names."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
import bench_train  # noqa: E402
from tests.bench.test_bench_train import _run  # noqa: E402


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


def test_the_harness_and_startup_tables_judge_their_targets():
    """The bugs they guard: the harness's generation ratio read from another task's row, the held-weights ratio
    judged the wrong way round, the start-up ratio inverted (HF over ours) or its silence target not applied."""
    import measure
    tasks = {t: {"examples": 40, "seconds": 10.0, "model_seconds": 8.0} for t in measure.bench_harness.TASKS}
    fast_generation = dict(tasks, tiny_generate={"examples": 40, "seconds": 2.0, "model_seconds": 1.0})
    memory = {"peak_rss": 2 ** 30, "weights": 100 * 2 ** 20}
    sides = {"ours": {"tasks": fast_generation, "memory": dict(memory, held=100 * 2 ** 20, programs=7)},
             "hf": {"tasks": tasks, "memory": memory}}
    rate = lambda key: {t: {side: s["tasks"][t]["examples"] / s["tasks"][t][key] for side, s in sides.items()}  # noqa: E731
                        for t in measure.bench_harness.TASKS}
    rates, model_rates = rate("seconds"), rate("model_seconds")
    s = dict(sides=sides, rates=rates, ratios={t: r["ours"] / r["hf"] for t, r in rates.items()},
             model_rates=model_rates, model_ratios={t: r["ours"] / r["hf"] for t, r in model_rates.items()})
    table = measure.harness_table(s)
    assert "| tiny_generate | 40 | 20.0 (40.0) | 4.0 (5.0) | **5.00x** (8.00x) |" in table
    assert "the hf backend, whole: met" in table and "1.00x the 100 MiB" in table and "(target ≤ 2x: met)" in table
    sides["ours"]["memory"]["held"] = 300 * 2 ** 20
    assert "(target ≤ 2x: not met)" in measure.harness_table(s)

    run = lambda wall, silence: dict(first_s=wall, first_cpu_s=wall, total_cpu_s=wall, longest_silence_s=silence)  # noqa: E731
    startup = measure.startup_table({"sides": {"predict": run(8.0, 2.0), "hf": run(10.0, 9.0)}})
    assert "**0.80x**" in startup and "target ≤ 1x: met" in startup and "(target ≤ 3 s: met)" in startup
    startup = measure.startup_table({"sides": {"predict": run(12.0, 4.0), "hf": run(10.0, 9.0)}})
    assert "**1.20x**" in startup and "target ≤ 1x: not met" in startup and "(target ≤ 3 s: not met)" in startup
