"""devices/gpus.py on CPU: the start-up decisions over fake facts (what is missing, how to fix it), the start-up
line, memory settings and the sessions' GPU options. tests/hardware/test_on_gpu.py runs the GPU paths where a GPU is
visible; the fused kernels' path a job's graph is built with is tested in tests/execution/test_runner.py, the
placement listing in tests/execution/test_op_listing.py."""
import json

import pytest
import tensorflow.compat.v1 as tf

from conftest import CPU_DEVICES
from devices import gpus
from devices.cluster import ClusterPlacement
from devices.placement import DeviceError, Placement
from tiny import tiny_config

H100 = gpus.Gpu(0, "NVIDIA H100 80GB HBM3", (9, 0))
T4 = gpus.Gpu(1, "Tesla T4", (7, 5))


def facts(**changes):
    values = dict(built_with_cuda=True, gpus=(H100, T4), driver_gpus=2, missing_wheels=(),
                  cuda_visible_devices=None, min_compute_capability=(6, 0))
    values.update(changes)
    return gpus.GpuFacts(**values)


def test_named_gpus_that_exist_and_run_pass():
    assert gpus.gpu_problem(facts(), [0]) is None
    assert gpus.gpu_problem(facts(), [1, 0]) is None


@pytest.mark.parametrize("changes,requested,expected", [
    (dict(built_with_cuda=False, gpus=()), [0], ["built without CUDA", "pip install -r requirements-gpu.txt"]),
    (dict(gpus=(), driver_gpus=0), [0], ["TensorFlow sees no GPU", "no NVIDIA driver", "nvidia-smi", "device:CPU:i"]),
    (dict(gpus=(), missing_wheels=("nvidia-cudnn-cu12",)), [0],
     ["driver shows 2", "CUDA and cuDNN libraries", "nvidia-cudnn-cu12", "pip install -r requirements-gpu.txt"]),
    (dict(gpus=()), [0], ["wheels are installed", "driver may be too old", "GPT_NEO_TF_LOGS=1"]),
    (dict(gpus=(), cuda_visible_devices=""), [0], ["CUDA_VISIBLE_DEVICES=''", "hides them all"]),
    (dict(gpus=(H100,)), [0, 3], ["device:GPU:3 not found", "found 1 GPU", "NVIDIA H100", "name device:GPU:0"]),
    (dict(gpus=(H100, T4)), [4, 2], ["device:GPU:4, device:GPU:2 not found", "found 2 GPUs", "device:GPU:0..1"]),
    (dict(gpus=(H100,), cuda_visible_devices="2"), [1], ["CUDA_VISIBLE_DEVICES='2' limits them"]),
    (dict(gpus=(H100, gpus.Gpu(1, "Tesla K80", (3, 7)))), [1], ["Tesla K80", "compute capability 3.7", "6.0"]),
])
def test_each_missing_piece_is_one_line_naming_the_fix(changes, requested, expected):
    problem = gpus.gpu_problem(facts(**changes), requested)
    assert problem and "\n" not in problem
    if "compute capability" not in problem:
        assert problem.startswith(", ".join(f"device:GPU:{i}" for i in requested if i >= len(facts(**changes).gpus))
                                  + " not found: ")
    for text in expected:
        assert text in problem


def test_configure_stops_before_touching_tensorflow_on_a_problem():
    with pytest.raises(DeviceError, match="built without CUDA"):
        gpus.configure_gpus([0], "growth", facts(built_with_cuda=False, gpus=()))
    with pytest.raises(DeviceError, match="--gpu_memory takes"):
        gpus.configure_gpus([0], "all", facts())
    # without a memory setting (a multi-host worker): checked, named as they are, visibility left alone
    setting = gpus.configure_gpus([1, 0], None, facts())
    assert setting.names == ("/device:GPU:1", "/device:GPU:0") and setting.memory is None


def test_only_the_named_gpus_are_visible_and_renumbered_from_zero():
    assert gpus.logical_names([0]) == ["/device:GPU:0"]
    assert gpus.logical_names([2, 3]) == ["/device:GPU:0", "/device:GPU:1"]
    assert gpus.logical_names([3, 1]) == ["/device:GPU:1", "/device:GPU:0"]  # the mesh keeps --gpu_ids' order


@pytest.mark.parametrize("text,growth,fraction", [(None, True, None), ("growth", True, None), ("0.9", False, 0.9),
                                                  ("1", False, 1.0)])
def test_gpu_memory_flag(text, growth, fraction):
    memory = gpus.parse_gpu_memory(text)
    assert (memory.growth, memory.fraction) == (growth, fraction)


@pytest.mark.parametrize("text", ["0", "1.2", "-0.5", "most", ""])
def test_gpu_memory_flag_rejects_what_is_not_growth_or_a_fraction(text):
    if text == "":
        assert gpus.parse_gpu_memory(text).growth  # empty: the default
        return
    with pytest.raises(DeviceError, match="--gpu_memory takes 'growth' or a fraction"):
        gpus.parse_gpu_memory(text)


def test_sessions_see_only_the_configured_gpus_with_their_memory_setting(monkeypatch):
    cpu = Placement(devices=tuple(CPU_DEVICES[:2])).session_config()
    assert cpu.device_count["GPU"] == 0 and cpu.device_count["CPU"] == 2  # a CPU mesh leaves the GPUs alone
    names = ("/device:GPU:0", "/device:GPU:1")
    placement = Placement(devices=names, gpu=gpus.GpuSetting(names, (2, 3), gpus.parse_gpu_memory("growth")))
    assert [placement.gpu.physical_of(n) for n in names] == [2, 3]
    config = placement.session_config()
    assert config.gpu_options.visible_device_list == "2,3" and config.gpu_options.allow_growth
    assert config.allow_soft_placement and "GPU" not in config.device_count
    one = ("/device:GPU:0",)
    config = Placement(devices=one, gpu=gpus.GpuSetting(one, (1,), gpus.parse_gpu_memory("0.9"))).session_config()
    assert config.gpu_options.visible_device_list == "1" and not config.gpu_options.allow_growth
    assert config.gpu_options.per_process_gpu_memory_fraction == pytest.approx(0.9)
    remote = ClusterPlacement(devices=("/job:worker/task:1/device:GPU:0",), master="grpc://h:1").session_config()
    assert not remote.gpu_options.visible_device_list and "GPU" not in remote.device_count


def test_start_up_line_names_each_gpu_its_capability_and_memory():
    probe = gpus.ProbeResult({"/device:GPU:0": 80 * gpus.GIB, "/device:GPU:1": 14.5 * gpus.GIB}, None)
    line = gpus.describe(["/device:GPU:0", "/device:GPU:1"], facts(), [0, 1], probe, gpus.GpuMemory(), True)
    assert line == ("GPUs: device:GPU:0 = NVIDIA H100 80GB HBM3 (compute capability 9.0, 80.0 GiB for TensorFlow); "
                    "device:GPU:1 = Tesla T4 (compute capability 7.5, no bfloat16 tensor cores, 14.5 GiB for "
                    "TensorFlow); memory growth; fused kernels: XLA:GPU")
    renumbered = gpus.describe(["/device:GPU:0"], facts(), [1], gpus.ProbeResult({}, "x"), gpus.GpuMemory(False, 0.9),
                               False)
    assert renumbered.startswith("GPUs: device:GPU:0 (physical GPU 1) = Tesla T4")
    assert renumbered.endswith("0.9 of its memory reserved; fused kernels: plain TensorFlow ops")


def test_kernel_path_falls_back_to_plain_ops_with_one_line_on_how_to_fix_it():
    assert gpus.kernel_path(False, None) == (True, None)
    assert gpus.kernel_path(True, None) == (False, None)  # forced: no warning
    assert gpus.kernel_path(True, "libdevice not found") == (False, None)
    xla, line = gpus.kernel_path(False, "libdevice not found at ./libdevice.10.bc")
    assert not xla and "\n" not in line and line.startswith("warning: XLA:GPU does not work here")
    for text in ("libdevice not found", "plain TensorFlow ops", "pip install -r requirements-gpu.txt",
                 "XLA_FLAGS=--xla_gpu_cuda_data_dir="):
        assert text in line


def test_the_line_of_an_xla_error_that_names_the_missing_piece():
    message = ("INTERNAL: Generating device code failed.\n\n\tlibdevice not found at ./libdevice.10.bc\n"
               "\t [[{{node PartitionedCall}}]]")
    assert gpus.first_line(message) == "libdevice not found at ./libdevice.10.bc"
    assert gpus.first_line("Something else\nmore") == "Something else"
    assert gpus.first_line("Graph execution error:\n\nDetected unsupported operations ... AsString\n\t [[Call]]") \
        == "Detected unsupported operations ... AsString"


def test_the_probe_compiles_and_checks_its_values_on_a_cpu_device():
    result = gpus.probe([CPU_DEVICES[0], CPU_DEVICES[1]], tf.ConfigProto(device_count={"CPU": 4}))
    assert result.xla_error is None and result.memory == {}


def test_the_probe_reports_what_xla_cannot_compile(monkeypatch):
    """An XLA failure (here an op XLA has no kernel for, standing in for a missing libdevice) is the probe's
    answer, not an exception: start-up falls back to plain ops. The plain probe runs the same function."""
    monkeypatch.setattr(gpus, "_probe_function",
                        lambda x, dtype="float32": tf.cast(tf.strings.length(tf.strings.as_string(x)), tf.float32))
    result = gpus.probe([CPU_DEVICES[0]], tf.ConfigProto(device_count={"CPU": 4}))
    assert "unsupported operations" in result.xla_error and "\n" not in result.xla_error


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="needs a machine without a GPU")
def test_the_probe_stops_where_tensorflow_has_no_such_gpu():
    with pytest.raises(DeviceError, match="created no device"):
        gpus.probe(["/device:GPU:0"], tf.ConfigProto(device_count={"CPU": 4}))


def test_start_up_does_nothing_on_cpu_devices():
    placement = Placement(devices=tuple(CPU_DEVICES[:1]), kernels="plain")
    assert gpus.start_up(placement, tf.ConfigProto()) == (placement, None)


def test_main_says_what_is_missing_in_one_line_where_no_gpu_is_visible(tmp_path):
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    from workspace import run_main_in_process
    config = tmp_path / "m.json"
    config.write_text(json.dumps(dict(n_layer=2, n_embd=32, n_head=4, n_vocab=64, n_ctx=16, train_steps=1,
                                      mesh_shape="all:1", layout="", model_path=str(tmp_path / "run"))))
    result = run_main_in_process("--model", str(config), "--gpu_ids", "device:GPU:0")
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(errors) == 1, result.stderr[-2000:]
    assert errors[0].startswith("error: device:GPU:0 not found: ")
    assert "requirements-gpu.txt" in errors[0] or "device:CPU:i" in errors[0]


TF_221_ARCHS = ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"]  # tf.sysconfig.get_build_info() of TF 2.21's wheel


def test_build_architectures_and_the_ptx_jit_note():
    sass, ptx = gpus.build_architectures(TF_221_ARCHS)
    assert sass == ((6, 0), (7, 0), (8, 0), (8, 9)) and ptx == ((9, 0),)
    with_build = facts(sass=sass, ptx=ptx, gpus=(H100, T4, gpus.Gpu(2, "NVIDIA A10", (8, 6))))
    note = gpus.jit_note(with_build, [0])
    assert "compute capability 9.0" in note and "PTX 9.0" in note and "minutes" in note and "H100" in note
    assert gpus.jit_note(with_build, [1, 2]) is None  # 7.5 and 8.6 run the 7.0 and 8.0 machine code
    assert gpus.jit_note(facts(gpus=(H100,)), [0]) is None  # a build that does not say: no claim
    assert gpus.build_architectures(["sm_90a", "compute_100", "junk"]) == (((9, 0),), ((10, 0),))
    # the installed TensorFlow's own build info is read the same way (TF 2.21's wheel lists TF_221_ARCHS)
    listed = tf.sysconfig.get_build_info().get("cuda_compute_capabilities", [])
    assert (gpus.gather_facts().sass, gpus.gather_facts().ptx) == gpus.build_architectures(listed)


def test_bfloat16_is_refused_below_compute_capability_8_with_float16_named():
    machine = facts()  # H100 (9.0), T4 (7.5)
    assert gpus.precision_problem("bfloat16", machine, [0]) is None
    problem = gpus.precision_problem("bfloat16", machine, [0, 1])
    assert "device:GPU:1 (Tesla T4) has compute capability 7.5" in problem and '"float16"' in problem
    assert gpus.precision_problem("float16", machine, [1]) is None
    # start-up refuses it before touching the GPU (no GPU here: the probe would fail if it were reached)
    names = ("/device:GPU:0",)
    t4 = Placement(devices=names, gpu=gpus.GpuSetting(names, (1,), gpus.GpuMemory(), machine))
    with pytest.raises(DeviceError, match="precision bfloat16 needs bfloat16 tensor cores"):
        gpus.start_up(t4, tf.ConfigProto(), precision="bfloat16")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_xla_probe_computes_in_the_training_dtype(dtype):
    """On CPU devices: the probe compiles in `dtype` and matches numpy within that dtype's tolerance."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.placeholder(tf.float32, [8])
        y = gpus._probe_function(x, dtype)
        cast = [op.get_attr("DstT") for op in graph.get_operations() if op.type == "Cast"]
    assert tf.as_dtype(dtype) in cast or dtype == "float32"
    result = gpus.probe(["/device:CPU:0"], tf.ConfigProto(), xla=True, dtype=dtype)
    assert result.xla_error is None, result.xla_error


def test_torch_and_driver_lines_say_which_cuda_and_which_driver(tmp_path):
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
                       "GCC version:  gcc version 12.2.0\n")
    assert gpus.driver_version(str(version)) == "535.104.05"
    assert gpus.driver_version(str(tmp_path / "absent")) is None
    cpu_build = gpus.torch_cuda_problem("2.13.0+cpu", None, None)
    assert "CPU build" in cpu_build and "requirements-gpu-hf.txt" in cpu_build and "none loaded" in cpu_build
    cuda13 = gpus.torch_cuda_problem("2.13.0", "13.0", "535.104.05")
    assert "CUDA 13.0, which needs NVIDIA driver 580" in cuda13 and "535.104.05" in cuda13
    assert "torch 2.10.0" in cuda13
    assert "no NVIDIA driver" in gpus.torch_cuda_problem("2.10.0", "12.8", None)
    assert "sees no GPU although NVIDIA driver 550.1 is loaded" in gpus.torch_cuda_problem("2.10.0", "12.8", "550.1")


def test_gpu_tests_skip_with_the_driver_and_tensorflows_cuda():
    from tests.hardware import test_on_gpu as test_gpu
    if not test_gpu.GPUS:
        assert "NVIDIA driver" in test_gpu.REASON and "TensorFlow built for CUDA" in test_gpu.REASON


def test_gpu_start_up_checks_and_probes_the_precision_training_resolves(monkeypatch):
    """precision "auto" (the config default) trains in float32 on GPUs: the start-up checks and probes that."""
    asked = []
    monkeypatch.setattr(gpus, "start_up", lambda placement, config, xla_autoclustering=False, precision="float32",
                        tf32=None: asked.append(precision) or (placement, None))
    on_gpu = Placement(devices=("/device:GPU:0",))
    for wanted in ("auto", "bfloat16", "float16", "float32"):
        on_gpu.start_up(precision=wanted)
    assert asked == ["float32", "bfloat16", "float16", "float32"]


@pytest.mark.parametrize("allow_tf32", [False, True])
def test_float32_is_float32_on_gpus_unless_the_config_allows_tf32_and_the_peak_follows(monkeypatch, capsys,
                                                                                       allow_tf32):
    """A placement on GPUs, started up by devices/kinds.place from a config: TensorFlow's TF32 (its default
    on Ampere and newer) is off unless `allow_tf32`, the start-up line says which, and the MFU peak of float32 is
    the datasheet's fp32 or TF32 figure accordingly. No GPU here: the placement is faked (an A100's facts), the
    probe answers without a session, and TensorFlow's process-wide flag is what is checked.
    Bugs caught: gpus.start_up not calling set_tf32 (TensorFlow's TF32 default left on), place not passing the
    config's allow_tf32, a peak that counts TF32 while matmuls run in float32."""
    from devices import peaks, kinds
    from devices.placement import DeviceRequest
    a100 = "NVIDIA A100-SXM4-80GB"
    names = ("/device:GPU:0",)
    machine = facts(gpus=(gpus.Gpu(0, a100, (8, 0)),), driver_gpus=1)
    faked = Placement(devices=names, gpu=gpus.GpuSetting(names, (0,), gpus.GpuMemory(), machine))
    monkeypatch.setattr(Placement, "from_request", classmethod(lambda cls, request, cfg=None: faked))
    monkeypatch.setattr(gpus, "probe", lambda names, config, xla=True, dtype="float32": gpus.ProbeResult({}, None))
    monkeypatch.setattr(peaks, "gpu_name", lambda index: a100)
    previous = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(not allow_tf32)  # the other way round beforehand
    try:
        placement = kinds.place(DeviceRequest(), tiny_config(precision="float32", allow_tf32=allow_tf32))
        assert tf.config.experimental.tensor_float_32_execution_enabled() is allow_tf32
        peak = placement.peak("float32").flops
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(previous)
    line = capsys.readouterr().out
    assert ("float32 matmuls as TF32 (allow_tf32)" if allow_tf32 else "float32 matmuls in float32 (TF32 off)") in line
    assert peak == peaks.known_gpu_peak(a100, "float32", tf32=allow_tf32)
    assert peaks.known_gpu_peak(a100, "float32", tf32=True) > 4 * peaks.known_gpu_peak(a100, "float32", tf32=False)
