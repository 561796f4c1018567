"""The training precision per device (runtime/precision.py): bfloat16 under "auto" only on CPUs with bf16 matrix
units, an explicit precision kept with a warning where it is the slower one, the CPU's flags read from
/proc/cpuinfo, and the training start-up line naming the precision that trained."""
import pytest

from loading.config import load_config
from runtime import precision
from runtime.devices import Placement
from train import job

from conftest import CPU_DEVICES
from workspace import make_workspace

AVX2 = {"fpu", "sse2", "avx", "avx2", "fma"}                         # the 2-core AMD EPYC VM
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512_vnni"}              # AVX-512 without bf16 (Skylake, Cascade Lake)
AVX512_BF16 = AVX512 | {"avx512_bf16"}                              # Cooper Lake, Zen 4
AMX = AVX512_BF16 | {"amx_bf16", "amx_tile", "amx_int8"}            # Sapphire Rapids
GRAVITON3 = {"fp", "asimd", "sve", "bf16", "i8mm"}                  # aarch64 Features


@pytest.mark.parametrize("flags,expected", [(AVX2, "float32"), (AVX512, "float32"), (AVX512_BF16, "bfloat16"),
                                            (AMX, "bfloat16"), (GRAVITON3, "bfloat16"), (set(), "float32")])
def test_auto_trains_in_bf16_exactly_where_the_cpu_has_bf16_matrix_units(flags, expected):
    choice = precision.choose("auto", "CPU", flags)
    assert choice.precision == expected
    assert choice.note.startswith(f"precision auto: {expected}")  # one line says which, and why


@pytest.mark.parametrize("kind", ["GPU", "TPU"])
def test_auto_is_float32_on_accelerators_whatever_the_host_cpu(kind):
    assert precision.choose("auto", kind, AMX).precision == "float32"


@pytest.mark.parametrize("asked", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("flags", [AVX2, AVX512_BF16, AMX | {"amx_fp16"}])
def test_an_explicit_precision_is_what_trains(asked, flags):
    for kind in ("CPU", "GPU", "TPU"):
        assert precision.choose(asked, kind, flags).precision == asked


def test_an_explicit_16_bit_precision_without_its_units_says_float32_is_faster_here():
    for asked in ("bfloat16", "float16"):
        note = precision.choose(asked, "CPU", AVX2).note
        assert note.startswith(f"warning: precision {asked}") and "float32" in note and "\n" not in note
    assert precision.choose("bfloat16", "CPU", AVX512_BF16).note == ""    # has the units: nothing to say
    assert precision.choose("float16", "CPU", AMX | {"amx_fp16"}).note == ""
    assert precision.choose("float32", "CPU", AVX2).note == ""
    assert precision.choose("bfloat16", "GPU", AVX2).note == ""            # the host CPU does not matter there


def test_cpu_flags_and_name_are_read_from_cpuinfo(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\n"
                   "processor\t: 1\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    name, flags = precision.cpu_info(str(x86))
    assert name == "AMD EPYC 9B14" and {"avx2", "avx512f", "avx512_bf16"} <= flags
    assert "bf16 matrix units yes (avx512_bf16)" in precision.cpu_kind(name, flags)
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd sve bf16 i8mm\n")
    assert precision.units(precision.cpu_info(str(arm))[1]) == ["bf16"]
    assert precision.cpu_info(str(tmp_path / "missing")) == ("", frozenset())
    assert precision.for_placement("auto", Placement(devices=("/device:CPU:0",)), str(x86)).precision == "bfloat16"
    assert precision.for_placement("auto", Placement(devices=("/device:GPU:0",)), str(x86)).precision == "float32"
    assert precision.cpu_kind("", AVX2) == "unknown CPU: AVX2, bf16 matrix units none"


@pytest.mark.slow
@pytest.mark.parametrize("flags,trained", [(AVX2, "float32"), (AVX512_BF16, "bfloat16")])
def test_training_resolves_auto_for_this_cpu_and_says_which_precision_trained(tmp_path, monkeypatch, capsys,
                                                                              flags, trained):
    cfg = load_config(make_workspace(tmp_path, train_steps=1, steps_per_checkpoint=1), {})
    assert cfg.precision == "auto"  # the default
    monkeypatch.setattr(precision, "cpu_info", lambda path="/proc/cpuinfo": ("test CPU", frozenset(flags)))
    built = []
    original = job.loop.train
    monkeypatch.setattr(job.loop, "train", lambda cfg_, *a, **k: built.append(cfg_.precision) or original(cfg_, *a, **k))
    assert job.run_training(cfg, Placement(devices=tuple(CPU_DEVICES[:1])), job.TrainOptions(peak_tflops=1.0)) == 1
    out = capsys.readouterr().out
    assert f") in {trained}, steps 0 -> 1" in out and f"precision auto: {trained}" in out
    assert built == [trained]  # the model was built in it
