"""Memory before the wait (issue 22): training compares the dry run's estimate with the host RAM available and
refuses up front, in one line with the numbers and what would make it fit; --ignore_memory_check goes on."""
import json
import os

import pytest

import main
from config import load_config, replace
from plan import dry_run, memory_check
from devices.cluster import ClusterPlacement
from devices.placement import Placement
from tiny import tiny_config
from workspace import REPO, make_workspace

GIB = 2 ** 30


@pytest.mark.slow
def test_gpt3_xl_on_a_16_gib_host_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys, monkeypatch):
    model = json.loads(open(os.path.join(REPO, "configs", "gpt3_XL.json")).read())
    model.update(model_path=str(tmp_path / "run"), mesh_shape="all:1", layout="")  # one CPU device
    config = tmp_path / "gpt3_XL_here.json"
    config.write_text(json.dumps(model))
    monkeypatch.setattr(memory_check, "available_host_bytes", lambda: 16 * GIB)
    assert main.main(["--model", str(config)]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: training "), err
    plan = dry_run.make_plan(load_config(str(config)))
    need = plan.facts.master_bytes + plan.memory[plan.cfg.recompute_grad].total  # from the dry run's own numbers
    assert need > 16 * GIB
    assert dry_run.human_bytes(need) in err[0] and "16.00 GiB is available" in err[0], err[0]
    assert "--ignore_memory_check" in err[0] and "--dry_run --device_memory" in err[0], err[0]
    assert not os.path.exists(tmp_path / "run")


def test_the_advice_is_what_would_make_it_fit():
    cfg = tiny_config(train_batch_size=64, n_ctx=64, recompute_grad=False)
    plan = dry_run.make_plan(cfg)
    cpu = Placement(devices=("/device:CPU:0",))
    with_recompute = memory_check.host_need(plan, True, True)
    without = memory_check.host_need(plan, True, False)
    assert with_recompute < without
    with pytest.raises(memory_check.DoesNotFit, match="recompute_grad\": true"):
        memory_check.check_training(cfg, cpu, "tiny", available=(with_recompute + without) / 2)
    fixed = plan.facts.master_bytes + plan.memory[False].total - plan.memory[False].activations
    with pytest.raises(memory_check.DoesNotFit, match="lower train_batch_size"):
        memory_check.check_training(cfg, cpu, "tiny", available=(fixed + with_recompute) / 2)
    with pytest.raises(memory_check.DoesNotFit, match="alone take"):
        memory_check.check_training(cfg, cpu, "tiny", available=fixed / 2)
    assert "available" in memory_check.check_training(cfg, cpu, "tiny", available=without * 2)
    # GPUs: only the master copies are in host RAM; multi-host and TPU runs are not checked here.
    gpu = Placement(devices=("/device:GPU:0",))
    assert memory_check.check_training(cfg, gpu, "tiny", available=plan.facts.master_bytes * 1.01)
    with pytest.raises(memory_check.DoesNotFit, match="master copies"):
        memory_check.check_training(cfg, gpu, "tiny", available=plan.facts.master_bytes * 0.99)
    cluster = ClusterPlacement(devices=("/job:worker/task:0/device:CPU:0",), master="grpc://h:1", hosts=("h",))
    assert memory_check.check_training(cfg, cluster, "tiny", available=1.0) is None


@pytest.mark.slow
def test_ignore_memory_check_goes_on(tmp_path, capsys, monkeypatch):
    config = make_workspace(tmp_path, n_layer=1, attention_types=[[["global"], 1]], train_steps=1,
                            steps_per_checkpoint=1)
    monkeypatch.setattr(memory_check, "available_host_bytes", lambda: 1024.0)
    assert main.main(["--model", config, "--peak_tflops", "1"]) == 1
    assert "error: training" in capsys.readouterr().err
    assert main.main(["--model", config, "--peak_tflops", "1", "--ignore_memory_check"]) == 0


def meminfo_available() -> float:
    with open("/proc/meminfo") as f:
        return float(next(line.split()[1] for line in f if line.startswith("MemAvailable:"))) * 1024


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="no /proc/meminfo (psutil's reading is used)")
def test_available_memory_is_meminfos_lowered_to_the_cgroups_limit(tmp_path, monkeypatch):
    """It passed when available_host_bytes always returned None (no check at all). MemAvailable moves while the
    test reads it: within 10%."""
    monkeypatch.setattr(memory_check, "CGROUP", str(tmp_path))  # no limit: MemAvailable
    assert memory_check.available_host_bytes() == pytest.approx(meminfo_available(), rel=0.1)
    (tmp_path / "memory.max").write_text("max\n")  # cgroup v2 without a limit
    (tmp_path / "memory.current").write_text(f"{GIB}\n")
    assert memory_check.available_host_bytes() == pytest.approx(meminfo_available(), rel=0.1)
    (tmp_path / "memory.max").write_text(f"{GIB + 2 ** 20}\n")  # a pod's limit: 1 MiB left
    assert memory_check.available_host_bytes() == 2 ** 20
    (tmp_path / "memory.max").unlink()  # cgroup v1, its "no limit" is a huge number
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.usage_in_bytes").write_text(f"{GIB}\n")
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text(f"{2 ** 63 - 4096}\n")
    assert memory_check.available_host_bytes() == pytest.approx(meminfo_available(), rel=0.1)
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text(f"{GIB + 2 ** 21}\n")
    assert memory_check.available_host_bytes() == 2 ** 21


def test_the_check_answers_from_a_few_layers_and_builds_the_whole_graph_only_near_the_limit(monkeypatch):
    """n_layer 3000 spent minutes building the check's graph (100000: longer) before anything was said. The
    estimate comes from graphs of one and two layers; the whole model's graph is built only when the estimate is
    within 10% of the limit, and then decides."""
    from plan import model_graph
    built = []
    build = model_graph.build

    def recording(cfg, *args, **kwargs):
        assert cfg.n_layer <= 4, f"built a graph of {cfg.n_layer} layers"
        built.append(cfg.n_layer)
        return build(cfg, *args, **kwargs)

    monkeypatch.setattr(model_graph, "build", recording)
    cpu = Placement(devices=("/device:CPU:0",))
    deep = tiny_config(n_layer=100_000, attention_types=[[["global"], 100_000]])
    with pytest.raises(memory_check.DoesNotFit, match="alone take"):
        memory_check.check_training(deep, cpu, "deep", available=16 * GIB)
    with pytest.raises(memory_check.DoesNotFit, match="weights alone"):
        memory_check.check_inference(deep, cpu, "deep", "predict", available=GIB)
    assert sorted(set(built)) == [1, 2]  # one layer, and one more

    cfg = tiny_config(n_layer=4, attention_types=[[["global"], 4]])
    need = memory_check.host_need(dry_run.make_plan(cfg), True, cfg.recompute_grad)
    facts = dry_run.collect(cfg, recompute_flags=(False,))
    predict_need = memory_check.inference_host_need(facts, dry_run.inference_memory(facts, cfg, "predict"), 1, True)
    for available, whole in ((need * 2, False), (need * 0.95, True)):
        built.clear()
        try:
            memory_check.check_training(cfg, cpu, "tiny", available=available)
        except memory_check.DoesNotFit:
            assert available < need
        assert (4 in built) == whole, (available / need, built)
    for available, whole in ((predict_need * 2, False), (predict_need * 1.05, True)):
        built.clear()
        memory_check.check_inference(cfg, cpu, "tiny", "predict", available=available)
        assert (4 in built) == whole, (available / predict_need, built)


def _gpt3_xl_here(tmp_path):
    model = json.loads(open(os.path.join(REPO, "configs", "gpt3_XL.json")).read())
    model.update(model_path=str(tmp_path / "run"), mesh_shape="all:1", layout="")  # one CPU device
    config = tmp_path / "gpt3_XL_here.json"
    config.write_text(json.dumps(model))
    return str(config)


def test_gpt3_xl_predict_on_an_8_gib_host_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys,
                                                                                         monkeypatch):
    config = _gpt3_xl_here(tmp_path)
    monkeypatch.setattr(memory_check, "available_host_bytes", lambda: 8 * GIB)
    assert main.main(["--model", config, "--predict"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: predicting with "), err
    cfg = load_config(config)
    facts = dry_run.collect(cfg, recompute_flags=(False,))
    per_device = dry_run.inference_memory(facts, cfg, "predict")
    need = facts.master_weight_bytes + per_device.total  # the dry run's own numbers: weights, kv cache, activations
    assert need > 8 * GIB and dry_run.human_bytes(need) in err[0] and "8.00 GiB is available" in err[0], err[0]
    assert "kv cache" in err[0] and "--ignore_memory_check" in err[0], err[0]
    assert not os.path.exists(tmp_path / "run")
    # --ignore_memory_check goes on to the job, which then finds no checkpoint to predict from
    main.main(["--model", config, "--predict", "--ignore_memory_check"])
    assert "memory" not in capsys.readouterr().err


def test_the_inference_estimate_has_no_optimizer_state_and_counts_the_kv_cache():
    cfg = tiny_config(train_batch_size=8, eval_batch_size=4, predict_batch_size=4, n_ctx=64)
    facts = dry_run.collect(cfg, recompute_flags=(False,))
    predict = dry_run.inference_memory(facts, cfg, "predict")
    evaluate = dry_run.inference_memory(facts, cfg, "eval")
    training = dry_run.make_plan(cfg).memory[False]
    assert predict.weights == evaluate.weights == training.weights and evaluate.kv_cache == 0
    # keys and values of every layer for predict_batch_size (4) sequences of n_ctx, and each layer's q/k/v
    # weights stacked for the steps, at the activations' dtype
    assert predict.kv_cache == (2 * cfg.n_layer * 4 * cfg.n_ctx * cfg.n_embd
                                + cfg.n_layer * 3 * cfg.n_embd ** 2) * facts.activation_itemsize
    assert predict.total < training.total and evaluate.total < training.total
    assert dry_run.inference_memory(facts, replace(cfg, kv_cache=False), "predict").kv_cache == 0
    cpu = Placement(devices=("/device:CPU:0",))
    need = facts.master_weight_bytes + predict.total
    assert "available" in memory_check.check_inference(cfg, cpu, "tiny", "predict", available=need * 1.01)
    with pytest.raises(memory_check.DoesNotFit, match="lower predict_batch_size"):
        memory_check.check_inference(cfg, cpu, "tiny", "predict", available=need * 0.99)
    with pytest.raises(memory_check.DoesNotFit, match="weights alone"):
        memory_check.check_inference(cfg, cpu, "tiny", "eval", available=facts.master_weight_bytes)


def test_gpus_are_compared_with_their_free_memory(monkeypatch):
    assert memory_check.devices_short(10.0, {"a": 9.0, "b": 10.0, "c": 11.0}) == {"a": 9.0}
    assert memory_check.devices_short(10.0, {}) == {}
    cfg = tiny_config(train_batch_size=8, n_ctx=64, recompute_grad=True)
    plan = dry_run.make_plan(cfg)
    two = Placement(devices=("/device:GPU:0", "/device:GPU:1"))
    cfg2 = replace(cfg, mesh_shape="x:2", layout="batch:x")
    per_device2 = dry_run.make_plan(cfg2).memory[True].total
    host = plan.facts.master_bytes * 2
    fits = memory_check.check_training(cfg2, two, "tiny", available=host,
                                       gpu_free={"/device:GPU:0": per_device2 * 1.5, "/device:GPU:1": per_device2})
    assert "per GPU" in fits
    with pytest.raises(memory_check.DoesNotFit, match=r"/device:GPU:1 has .* free \(1 of 2 GPUs short\)"):
        memory_check.check_training(cfg2, two, "tiny", available=host,
                                    gpu_free={"/device:GPU:0": per_device2 * 1.5, "/device:GPU:1": per_device2 * 0.9})
    one = Placement(devices=("/device:GPU:0",))
    with pytest.raises(memory_check.DoesNotFit, match="per GPU"):
        memory_check.check_inference(cfg, one, "tiny", "predict", available=host, gpu_free={"/device:GPU:0": 1.0})
    # unknown free memory: only the host is compared
    assert "per GPU" not in memory_check.check_training(cfg, one, "tiny", available=host, gpu_free={})

    # nvidia-smi's indices through CUDA_VISIBLE_DEVICES; with --gpu_memory FRACTION that share of the total (this
    # process reserved it), else the free memory plus what this process holds already
    from devices import gpus
    smi = {0: (80 * GIB, 70 * GIB, 1 * GIB), 3: (40 * GIB, 10 * GIB, 2 * GIB)}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,0")
    names = ("/device:GPU:0", "/device:GPU:1")
    grown = Placement(devices=names, gpu=gpus.GpuSetting(names, (0, 1), gpus.GpuMemory()))
    assert memory_check.gpu_free_bytes(grown, read=lambda: smi) == {names[0]: 12 * GIB, names[1]: 71 * GIB}
    reserved = Placement(devices=names, gpu=gpus.GpuSetting(names, (0, 1), gpus.GpuMemory(False, 0.5)))
    assert memory_check.gpu_free_bytes(reserved, read=lambda: smi) == {names[0]: 20 * GIB, names[1]: 40 * GIB}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert memory_check.gpu_free_bytes(Placement(devices=names[:1]), read=lambda: smi) == {names[0]: 71 * GIB}


def test_nvidia_smi_is_read(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"  # answers the two queries as the real one does with csv,noheader,nounits
    fake.write_text("#!/bin/sh\ncase \"$1\" in\n"
                    f"  --query-compute-apps=*) echo '{os.getpid()}, 00000000:3B:00.0, 2048'\n"
                    "    echo '1, 00000000:3B:00.0, 9' ;;\n"
                    "  --query-gpu=*) echo '0, 00000000:3B:00.0, 81559, 10240'\n"
                    "    echo '1, 00000000:5E:00.0, 81559, [N/A]' ;;\n"
                    "esac\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert memory_check._nvidia_smi_memory() == {0: (81559 * 2 ** 20, 10240 * 2 ** 20, 2048 * 2 ** 20)}
