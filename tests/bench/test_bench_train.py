"""bench/bench_train.py's own arithmetic and its HF side: the shapes (bench's, GPT-Neo's context and batch, GPT-Neo
125M's), the summary's MFU and headline, and worker_hf on a tiny GPTNeo. The benchmark itself is not run here."""
import os
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
import bench_train  # noqa: E402
from models import flops  # noqa: E402
from models.attention import ATTENTION  # noqa: E402

# The tiny model the bench tests run (bench_train's model arguments), here and in tests/bench/test_profile_train.py.
TINY = dict(n_layer=2, n_embd=32, n_head=4, n_ctx=16, n_vocab=64, batch=2, window=4)


def test_the_neo_shape_is_gpt_neos_context_window_and_batch_and_flags_override_it():
    default, neo = bench_train.parse([]), bench_train.parse(["--shape", "neo"])
    assert (default.n_ctx, default.window, default.batch) == (256, 128, 8)
    assert (neo.n_ctx, neo.window, neo.batch) == (2048, 256, 1)
    assert bench_train.parse(["--shape", "neo", "--batch", "2"]).batch == 2
    cfg = bench_train.bench_config(bench_train.model_args(neo), model_path="run")
    assert cfg.attention_types == ("global", "local") * 3 and cfg.local_attention_radius == 256
    # MFU counts the keys each query really sees: a local layer's window, not the whole context
    assert ATTENTION["local"].keys_per_query(cfg) == 256 < ATTENTION["global"].keys_per_query(cfg) == 1024


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
    assert "**2.00x** (HF compile bfloat16)" in table and f"not met (≥ {measure.TRAIN_TARGETS['neo']:g}x)" in table


def test_auto_jit_rows_compare_each_mode_with_the_same_variants_default():
    """--auto_jit's rows: a mode's median tokens/s over the default of its own precision (not of another
    variant), its warm-up seconds, and how far its losses moved from the default's. Bug caught: every ratio taken
    against the first variant's default (a bfloat16 mode held to float32's tokens/s)."""
    def run(tokens, losses, first=10.0):
        return dict(tokens_per_s=tokens, loss_trajectory=losses, to_first_step_s=first, warmup_step_times=[1.0, 2.0])
    runs = {("float32", "default"): [run(100.0, [5.0, 4.0]), run(120.0, [5.0, 4.0]), run(110.0, [5.0, 4.0])],
            ("bfloat16", "default"): [run(200.0, [5.0, 4.1])],
            ("float32", "auto_jit"): [run(55.0, [5.0, 4.001], 40.0), run(50.0, [5.0, 4.0], 30.0),
                                      run(60.0, [5.0, 4.0], 50.0)],
            ("bfloat16", "auto_jit"): [run(300.0, [5.0, 4.1])]}
    rows = {(r["variant"], r["mode"]): r for r in bench_train.jit_summary(runs)}
    assert rows["float32", "auto_jit"]["ratio"] == pytest.approx(55.0 / 110.0)
    assert rows["bfloat16", "auto_jit"]["ratio"] == pytest.approx(1.5)
    assert rows["float32", "default"]["ratio"] == 1.0
    assert rows["float32", "auto_jit"]["to_first_step_s"] == 40.0
    assert rows["float32", "auto_jit"]["warmup_steps_s"] == 3.0
    assert rows["float32", "auto_jit"]["loss_difference"] == pytest.approx(0.001)


def test_a_relative_peer_python_is_resolved_before_the_workers_run_in_the_peer_repo(tmp_path, monkeypatch):
    """The peer's workers run with the peer checkout as their working folder, so `.venv/bin/python` given from
    this checkout named nothing there (a FileNotFoundError traceback after the first measurement): it is made
    absolute first, and a Python or a checkout that is not there is one error line naming it, before anything
    runs."""
    venv = tmp_path / "here" / ".venv" / "bin"
    venv.mkdir(parents=True)
    python = venv / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    monkeypatch.chdir(tmp_path / "here")
    args = bench_train.parse(["--skip_hf", "--peer_python", ".venv/bin/python", "--peer_repo", str(tmp_path)])
    monkeypatch.setattr("devices.precision.cpu_info", lambda: (_ for _ in ()).throw(RuntimeError("ran on")))
    with pytest.raises(RuntimeError, match="ran on"):  # past the check: the peer's Python is resolved
        bench_train.measure(args)
    assert args.peer_python == str(python)
    args = bench_train.parse(["--skip_hf", "--peer_python", "nowhere/python", "--peer_repo", str(tmp_path)])
    with pytest.raises(SystemExit, match="^error: --peer_python nowhere/python is not an executable"):
        bench_train.measure(args)
    args = bench_train.parse(["--skip_hf", "--peer_python", ".venv/bin/python", "--peer_repo", "no/checkout"])
    with pytest.raises(SystemExit, match="^error: --peer_repo no/checkout is not a folder"):
        bench_train.measure(args)
