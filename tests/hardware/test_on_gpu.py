"""On a GPU (skipped where TensorFlow sees none, with devices/gpus.py's reason): the start-up probe compiles with
XLA:GPU, a tiny model trains on device:GPU:0 with the CPU's losses (fused kernels on XLA:GPU and as plain ops,
float32 and bfloat16), every op of its training step placed on the GPU runs there, and main.py trains and
samples with --gpu_ids device:GPU:0, printing the start-up and placement lines.

Written without a GPU (none was lent to the session that wrote it): run it first on one with
`python -m pytest -q tests/hardware/test_on_gpu.py`."""

import pytest
import tensorflow.compat.v1 as tf

from devices import gpus
from execution import op_listing

# Lists devices only: TensorFlow does not start, so conftest.py's four CPU devices stay as they are.
GPUS = tf.config.list_physical_devices("GPU")
REASON = None if GPUS else (f"no GPU for these tests: {gpus.no_gpu_reason(gpus.gather_facts())} (NVIDIA driver "
                             f"{gpus.driver_version() or 'none'}; TensorFlow built for CUDA "
                             f"{tf.sysconfig.get_build_info().get('cuda_version', 'none')})")

pytestmark = pytest.mark.skipif(not GPUS, reason=REASON or "")


@pytest.fixture(scope="module")
def gpu_placement():
    """device:GPU:0 as main.py sets it up (only it visible, memory growth), where TensorFlow has not started yet
    in this process; else as it is (an earlier test started it: every GPU visible, the default allocator)."""
    from devices.placement import DeviceError, Placement
    try:
        setting = gpus.configure_gpus([0], "growth")
    except DeviceError:
        return Placement(devices=("/device:GPU:0",))
    return Placement(devices=setting.names, gpu=setting)


@pytest.fixture
def exact_float32():
    """float32 matmuls in full float32 (TensorFlow runs them as TF32 on Ampere and newer by default), so the GPU's
    losses compare with the CPU's at a tolerance that catches a wrong kernel."""
    previous = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(previous)


def test_start_up_probe_compiles_with_xla_gpu_and_reads_the_memory(gpu_placement, capsys):
    placement, result = gpus.start_up(gpu_placement, gpu_placement.session_config())
    line = capsys.readouterr().out
    assert result.xla_error is None, f"XLA:GPU does not compile here: {result.xla_error} (fix: {gpus.XLA_FIX})"
    assert result.memory.get(gpu_placement.devices[0], 0) > 1 << 30
    assert line.startswith("GPUs: device:GPU:0") and "compute capability" in line and "GiB for TensorFlow" in line
    assert "fused kernels: XLA:GPU" in line and placement.kernels == "xla"


@pytest.mark.usefixtures("exact_float32")
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("kernel_path", ["xla", "plain"])
def test_tiny_model_trains_on_the_gpu_as_on_the_cpu(tmp_path, gpu_placement, precision, kernel_path):
    """--selfcheck's comparison (selfcheck/job.py): from the same seeded weights, six steps on learnable data
    on the GPU and on the CPU; the CPU's loss must fall, every step's loss must match within the dtype's
    tolerance, and every weight after the first and the last step within a share of how far training moved
    it. tests/selfcheck/test_job.py shows on the CPU that this fails when the update is removed (in bfloat16)."""
    import dataclasses
    from config import config_from_dict
    from selfcheck import job

    on_gpu, on_cpu = job.model_settings(1, precision, str(tmp_path))
    data = job.learnable_tokens(on_gpu["train_batch_size"], on_gpu["n_ctx"], on_gpu["n_vocab"])
    gpu = job.train_and_time(config_from_dict(on_gpu), dataclasses.replace(gpu_placement, kernels=kernel_path), data)
    cpu = job.train_and_time(config_from_dict(on_cpu), dataclasses.replace(job.REFERENCE, kernels=kernel_path), data)
    verdict = job.judge(gpu, cpu, job.TOLERANCES[precision])
    assert verdict.passed, verdict.problems


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_every_op_of_the_training_step_placed_on_the_gpu_runs_there(tmp_path, gpu_placement, precision, capsys):
    from tiny import fixed_batches, random_tokens, tiny_config
    from train import loop

    cfg = tiny_config(model_path=str(tmp_path / "run"), precision=precision)
    program = loop.training_program(cfg, gpu_placement, fixed_batches(random_tokens([8, 17]), 4), 0)
    with program.open(None) as session:
        program.start(session)
        program.run(session, 1)
        program.run(session, 1)  # the listing is printed once, for the first step
    report = program.placement_report
    line = capsys.readouterr().out
    assert line.count("placement: ") == 1
    assert report is not None and sum("GPU" in placed for _, _, _, placed in report.ops) > 100
    assert not report.fallbacks, op_listing.describe_placement(report)


def test_main_trains_and_samples_on_the_gpu_with_its_start_up_lines(tmp_path):
    from workspace import make_workspace, run_main
    config = make_workspace(tmp_path)
    trained = run_main("--model", config, "--gpu_ids", "device:GPU:0", "--log_every", "1")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "GPUs: device:GPU:0 = " in trained.stdout and "fused kernels: XLA:GPU" in trained.stdout
    assert "placement: all " in trained.stdout, trained.stdout
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("def main(")
    sampled = run_main("--model", config, "--gpu_ids", "device:GPU:0", "--predict", "--prompt", str(prompt))
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    assert "GPUs: device:GPU:0 = " in sampled.stdout
