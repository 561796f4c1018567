"""devices/placement.py: this host's devices named and checked (one error line naming the fix), the sessions'
options on CPU devices, and the kernels' path a placement starts up with."""
import pytest
from tensorflow.core.protobuf import rewriter_config_pb2

from conftest import CPU_DEVICES
from devices import gpus, tpu_access
from devices import placement as device_placement
from devices.placement import Placement


def test_device_errors_are_one_line_and_say_what_to_pass():
    with pytest.raises(device_placement.DeviceError) as info:
        device_placement.configure(["device:GPU:99"])
    assert str(info.value).startswith("device:GPU:99 not found: ") and "\n" not in str(info.value)
    with pytest.raises(device_placement.DeviceError, match="not understood"):
        device_placement.configure(["gpu0"])
    with pytest.raises(device_placement.DeviceError) as info:
        device_placement.check_mesh_fits("x:2,y:2", 4, ["/device:CPU:0"])
    assert "4 devices but 1 were given" in str(info.value) and "--mesh_shape" in str(info.value)
    assert device_placement.configure(["device:CPU:0", "device:CPU:1"]) == ["/device:CPU:0", "/device:CPU:1"]


def test_cpu_sessions_run_without_grappler_fusing_matmul_and_bias():
    """Every session on CPUs (training's, evaluation's, predict's sampling and scoring: one config) keeps the
    remapper off: its fused matmul + bias kernel is slower for decoding's matrix-vector products and fuses nothing
    in training; GPUs keep TF's default."""
    off = rewriter_config_pb2.RewriterConfig.OFF
    cpus = Placement(devices=tuple(CPU_DEVICES[:2]))
    assert cpus.session_config().graph_options.rewrite_options.remapping == off
    names = ("/device:GPU:0",)
    on_gpu = Placement(devices=names, gpu=gpus.GpuSetting(names, (0,), gpus.parse_gpu_memory("growth")))
    assert on_gpu.session_config().graph_options.rewrite_options.remapping != off


def test_cpu_sessions_skip_the_grappler_passes_that_buy_nothing_there():
    """Sessions on CPUs run grappler once over each graph, without its memory and layout optimizers (start-up they
    cost, the programs' ops stay the same: lean_grappler); GPUs' sessions keep TF's defaults."""
    config = rewriter_config_pb2.RewriterConfig
    cpus = Placement(devices=tuple(CPU_DEVICES[:2]))
    rewrites = cpus.session_config().graph_options.rewrite_options
    assert rewrites.meta_optimizer_iterations == config.ONE
    assert not rewrites.disable_tfg_optimizer  # without it a copy of Adam's slots outlived their initialisation
    assert rewrites.memory_optimization == config.NO_MEM_OPT
    assert rewrites.layout_optimizer == config.OFF
    assert not rewrites.disable_meta_optimizer  # the passes the programs need still run
    names = ("/device:GPU:0",)
    on_gpu = Placement(devices=names, gpu=gpus.GpuSetting(names, (0,), gpus.parse_gpu_memory("growth")))
    assert on_gpu.session_config().graph_options.rewrite_options == config()


def test_cpu_meshes_take_plain_kernels_where_tensorflow_has_no_xla_cpu(monkeypatch, capsys):
    from devices import placement
    from devices.placement import Placement
    assert placement.xla_cpu_problem() is None  # this TensorFlow compiles for the CPU
    cpu = Placement(devices=("/device:CPU:0",))
    assert cpu.start_up().kernels == "xla"
    # tensorflow-tpu 2.20: no XLA:CPU (its error, as it reads)
    monkeypatch.setattr(tpu_access, "tensorflow_distribution", lambda: ("tensorflow-tpu", "2.20.0"))
    monkeypatch.setattr(placement, "xla_cpu_problem", lambda: "could not find registered transfer manager for "
                                                            "platform Host -- check target linkage")
    assert cpu.start_up().kernels == "plain"
    assert "XLA cannot compile for the CPU in tensorflow-tpu" in capsys.readouterr().err
