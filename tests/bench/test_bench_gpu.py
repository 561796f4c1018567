"""bench/bench_gpu.py's tables (the GPU itself is not needed: the workers' results are given): MFU against the
peak of the precision each row ran in, and the ratios ours / HF."""
import os
import re
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
import bench_gpu  # noqa: E402


def cells(lines: list, label: str) -> list:
    """The numbers of the row that starts with `label`."""
    row = next(line for line in lines if line.startswith(label))
    return [float(x.replace(",", "")) for x in re.findall(r"[\d,]+\.?\d*", row[len(label):])]


def test_training_mfu_uses_the_peak_of_its_precision_and_decoding_compares_per_token_times():
    """Two precisions whose peaks differ fourfold: each row's MFU is its tokens/s times the model's FLOPs per token
    over its own precision's peak, the ratio is ours over HF in that precision; a side that did not run is a
    skipped row. Decoding's ratio at each prompt is HF's ms per token over ours. (Bug: every row's MFU against the
    first precision's peak, `peaks[args.precisions[0]]`: bf16 MFU overstated by the peaks' ratio.)"""
    args = SimpleNamespace(precisions=["float32", "bfloat16"], new_tokens=[8, 40], repeats=3, decode_ctx=2048,
                           prompt_lengths=[16, 256])
    peaks = {"float32": {"flops": 100e12, "source": "datasheet"}, "bfloat16": {"flops": 400e12, "source": "datasheet"}}
    ours = {"float32": {"tokens_per_s": 3000.0, "step_s": 2.0, "flops_per_token": 1e10},
            "bfloat16": {"tokens_per_s": 8000.0, "step_s": 0.5, "flops_per_token": 1e10}}
    hf = {"float32": {"tokens_per_s": 2000.0, "step_s": 3.0}, "bfloat16": {"skipped": "no CUDA PyTorch"}}
    lines = bench_gpu.training_table(args, peaks, ours, hf)
    for precision in args.precisions:
        tokens, step, tflops, mfu = cells(lines, f"ours {precision}")[:4]
        flops = ours[precision]["tokens_per_s"] * ours[precision]["flops_per_token"]
        assert tflops == pytest.approx(flops / 1e12, abs=0.05)
        assert mfu == pytest.approx(100 * flops / peaks[precision]["flops"], abs=0.05), precision
    assert cells(lines, "ours float32")[4] == pytest.approx(3000 / 2000, abs=0.005)
    assert cells(lines, "HF GPTNeo float32")[3] == pytest.approx(100 * 2000 * 1e10 / 100e12, abs=0.05)
    assert "skipped: no CUDA PyTorch" in next(line for line in lines if line.startswith("HF GPTNeo bfloat16"))

    def decode(ms):
        return {"path": "xla", "by_prompt": {str(p): {"per_token_ms": t} for p, t in zip(args.prompt_lengths, ms)}}
    table = bench_gpu.decoding_table(args, {"float32": decode([4.0, 5.0]), "bfloat16": decode([2.0, 2.5])},
                                     {"float32": decode([10.0, 9.0])})
    ratios = next(line for line in table if line.startswith("decode tokens/s float32"))
    assert f"prompt 16: {10 / 4:.2f}x" in ratios and f"prompt 256: {9 / 5:.2f}x" in ratios
    assert not any(line.startswith("decode tokens/s bfloat16") for line in table)  # no HF run to compare with
