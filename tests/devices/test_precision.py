"""The precision per device (devices/precision.py): bfloat16 under "auto" only on CPUs with bf16 matrix units, an
explicit precision kept with a warning where it is the slower one, the CPU's flags read from /proc/cpuinfo, the
training start-up line naming the precision that trained; and the one rule every job follows: --eval, the
evaluations during training, the harness, --predict and --export run in training's precision for the device (or
float32 with eval_precision), give the same numbers by every path and record the precision with each result."""
import json
import os

import pytest

from config import load_config
from devices import precision
from devices.placement import Placement
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


def forced_cpu(monkeypatch, flags):
    """This host's CPU as one with `flags` (bf16 matrix units or not), for every job that resolves "auto"."""
    monkeypatch.setattr(precision, "cpu_info", lambda path="/proc/cpuinfo": ("test CPU", frozenset(flags)))


@pytest.mark.parametrize("asked,eval_precision,kind,flags,trains,runs", [
    ("auto", "auto", "CPU", AVX512_BF16, "bfloat16", "bfloat16"),    # evaluation follows training's resolution
    ("auto", "auto", "CPU", AVX2, "float32", "float32"),
    ("auto", "float32", "CPU", AVX512_BF16, "bfloat16", "float32"),  # float32 scoring asked for
    ("auto", "auto", "GPU", AVX512_BF16, "float32", "float32"),
    ("bfloat16", "auto", "CPU", AVX2, "bfloat16", "bfloat16"),       # an explicit precision, wherever it runs
    ("float16", "float32", "GPU", AVX2, "float16", "float32"),
])
def test_every_job_resolves_the_precision_by_the_one_rule(asked, eval_precision, kind, flags, trains, runs,
                                                          monkeypatch, capsys):
    """Training's precision and the one the jobs running the trained model use (--eval, the evaluations after
    each checkpoint, the harness, --predict, --export) come from devices/precision.py: the same resolution of
    "auto" for the same device, float32 where eval_precision asks; resolving training's config again (what
    training hands its evaluations) changes nothing. One line says so where something other than float32 was
    resolved, or float32 asked over it.
    Bugs caught: eval_precision ignored, an evaluation resolving "auto" to float32 (as models/gpt.py reads it)."""
    from tiny import tiny_config
    forced_cpu(monkeypatch, flags)
    cfg = tiny_config(precision=asked, eval_precision=eval_precision)
    placement = Placement(devices=(f"/device:{kind}:0",))
    trained, _ = precision.for_training(cfg, placement)
    assert trained.precision == trains
    for handed in (cfg, trained):  # --eval's config, and the one training hands its evaluations
        resolved = precision.for_inference(handed, placement)
        assert resolved.precision == runs and precision.running(resolved) == runs
        said = capsys.readouterr().out
        if runs == "float32" and trains != "float32":
            assert said.startswith(f"eval_precision float32: the model runs in float32 (training's precision "
                                   f"here: {trains})") and said.count("\n") == 1
        elif handed.precision == "auto" and runs != "float32":
            assert said.startswith(f"precision auto: the model runs in {runs}") and "--eval_precision float32" in said
        else:
            assert said == ""


def results(model_path) -> list:
    with open(os.path.join(model_path, "eval_results.jsonl")) as f:
        return [json.loads(line) for line in f]


def numbers(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in ("time", "precision")}


@pytest.mark.slow
@pytest.mark.parametrize("flags,trained", [(AVX2, "float32"), (AVX512_BF16, "bfloat16")])
def test_eval_gives_the_numbers_the_evaluation_during_training_gave(tmp_path, monkeypatch, flags, trained):
    """Training under the default precision "auto" resolves it for this CPU, says which precision trained and
    builds the model in it. One checkpoint, evaluated after training saved it (the validation loss, an eval task, a
    harness task) and again by `main.py --eval`: the same numbers, each row and line naming the precision, on a
    CPU that trains in float32 and on one that trains in bfloat16 (this CPU's flags stand in for one).
    `--eval_precision float32` scores the same checkpoint in float32: the validation loss a float32 program gives.
    Bugs caught: train/job.py handing the loop the config unresolved (the model built from "auto"), evals/job.py
    (or main.py) handing the evaluations the config unresolved (--eval in float32, as models/gpt.py reads "auto",
    where training evaluated in bfloat16: 190.66 against 190.59 in the issue), the harness's model resolving its
    own way, rows or lines without the precision, eval_precision not reaching --eval."""
    from evals import validation
    from config import replace
    from workspace import REPO, run_main_in_process
    forced_cpu(monkeypatch, flags)
    (tmp_path / "lambada.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in (
        "import os and then import sys", "def read(self, name): return self.name", "class Foo(object): pass")))
    config = make_workspace(tmp_path, train_steps=1, steps_per_checkpoint=1, eval_steps=2, eval_tasks=["lambada"],
                            lambada_path=str(tmp_path / "lambada.jsonl"), harness_tasks=["tiny_lambada"],
                            harness_include_path=os.path.join(REPO, "tests/fixtures/harness_tasks"), harness_limit=3)
    assert load_config(config).precision == "auto"  # the default
    built = []  # the precision of the config the loop built the model from
    original = job.loop.train
    monkeypatch.setattr(job.loop, "train", lambda cfg_, *a, **k: built.append(cfg_.precision) or original(cfg_, *a, **k))
    training = run_main_in_process("--model", config)
    assert training.returncode == 0, training.stderr[-3000:]
    assert f") in {trained}, steps 0 -> 1" in training.stdout and f"precision auto: {trained}" in training.stdout
    assert built == [trained]
    during = results(tmp_path / "run")
    assert [(r["task"], r["step"]) for r in during] == [("validation", 1), ("lambada", 1), ("harness/tiny_lambada", 1)]

    evaluated = run_main_in_process("--model", config, "--eval")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    after = results(tmp_path / "run")[len(during):]
    assert [numbers(r) for r in after] == [pytest.approx(numbers(r), rel=1e-6) for r in during]
    assert {r["precision"] for r in during + after} == {trained}
    for line in ("eval at step 1: loss", "eval task lambada at step 1:", "harness tiny_lambada at step 1:"):
        shown = next(l for l in evaluated.stdout.splitlines() if l.startswith(line))
        assert trained in shown, shown
    harness_json = json.loads((tmp_path / "run" / "harness" / "results_1.json").read_text())
    assert harness_json["gpt_neo"]["precision"] == trained

    in_float32 = run_main_in_process("--model", config, "--eval", "--eval_precision", "float32")
    assert in_float32.returncode == 0, in_float32.stderr[-3000:]
    rows = results(tmp_path / "run")[len(during) + len(after):]
    assert {r["precision"] for r in rows} == {"float32"}
    cfg = load_config(config)
    with validation.Validation(replace(cfg, precision="float32"), Placement(devices=tuple(CPU_DEVICES[:1]))) as v:
        assert rows[0]["loss"] == pytest.approx(v.loss(str(tmp_path / "run" / "model.ckpt-1")), rel=1e-6)
    if trained == "bfloat16":  # the two precisions' numbers differ far beyond the tolerance above
        assert abs(rows[0]["loss"] - during[0]["loss"]) > 1e-5 * during[0]["loss"]


@pytest.mark.slow
def test_predict_and_export_record_the_precision_they_ran_in(trained_workspace, tmp_path, monkeypatch):
    """On a CPU where "auto" trains in bfloat16, --predict samples in bfloat16 and says so (each sample's header,
    the closing line, every jsonl record), --eval_precision float32 samples in float32, and --export's
    gpt_config.json names the precision its graph computes in (never "auto").
    Bugs caught: infer/job.py handing --predict or --export the config unresolved (float32 where training ran
    bfloat16), a record or the export's metadata without the precision, or with "auto" in it."""
    from workspace import copy_workspace, run_main_in_process
    forced_cpu(monkeypatch, AVX512_BF16)
    config, model_path = copy_workspace(trained_workspace, tmp_path, sampling_seed=3)
    for flags, expected in (((), "bfloat16"), (("--eval_precision", "float32"), "float32")):
        sampled = run_main_in_process("--model", config, "--predict", "--num_samples", "1",
                                      "--predict_output", str(tmp_path / expected), *flags)
        assert sampled.returncode == 0, sampled.stderr[-3000:]
        assert f"======== sample 0 (step 2) in {expected} ========" in sampled.stdout
        assert f", {expected}) to " in sampled.stdout.splitlines()[-1]
        with open(tmp_path / f"{expected}.jsonl") as f:
            assert [json.loads(line)["precision"] for line in f] == [expected]
    exported = run_main_in_process("--model", config, "--export", "--export_dir", str(tmp_path / "export"))
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert exported.stdout.rstrip().endswith("bfloat16)")
    metadata = json.loads((tmp_path / "export" / "assets.extra" / "gpt_config.json").read_text())
    assert metadata["precision"] == "bfloat16" and metadata["eval_precision"] == "auto"
