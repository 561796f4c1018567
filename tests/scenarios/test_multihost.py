"""Multi-host training on TensorFlow's distributed runtime: two processes on loopback train a 2-device mesh
across them and match one process on two logical CPU devices."""
import glob
import json
import os
import re
import socket
import subprocess

import numpy as np
import pytest

from ports import loopback_ports
import tensorflow.compat.v1 as tf

import main
from devices import cluster as cluster_lib
from devices.placement import DeviceError, Placement
from workspace import make_workspace, start_main

TINY = dict(n_layer=2, n_embd=32, n_head=4, n_vocab=4096, n_ctx=16, attention_types=[[["global", "local"], 1]],
            local_attention_radius=4, train_batch_size=4, eval_batch_size=4, train_steps=3, steps_per_checkpoint=3,
            lr=0.003, datasets=[["tiny", 2, "documents_random", 1.0]], mesh_shape="x:2", layout="batch:x")
LOSS = re.compile(r"step +(\d+)/3 \| loss ([0-9.]+)")


def free_ports(n):
    return loopback_ports(n)


def finish(processes: dict, timeouts: dict) -> dict:
    """Waits for each process in turn; on a timeout kills them all and fails showing every output."""
    results, waiting = {}, None
    try:
        for waiting, process in processes.items():
            out, _ = process.communicate(timeout=timeouts[waiting])
            results[waiting] = (process.returncode, out)
    except subprocess.TimeoutExpired:
        outputs = []
        for name, process in processes.items():
            if process.poll() is None:
                process.kill()
            out = results[name][1] if name in results else process.communicate()[0]
            outputs.append(f"--- {name} (exit {process.returncode}):\n{out[-2500:]}")
        pytest.fail(f"{waiting} did not exit within {timeouts[waiting]} s\n" + "\n".join(outputs))
    return results


def weights(model_path):
    checkpoint = tf.train.latest_checkpoint(model_path)
    return {name: tf.train.load_variable(checkpoint, name) for name, _ in tf.train.list_variables(checkpoint)
            if name.startswith("gpt2/")}


def training_graph(model_path):
    """The GraphDef that training wrote to model_path's TensorBoard events."""
    for path in sorted(glob.glob(os.path.join(str(model_path), "events.*"))):
        for event in tf.train.summary_iterator(path):
            if event.graph_def:
                return tf.GraphDef.FromString(event.graph_def)
    raise AssertionError(f"no graph in the events of {model_path}")


@pytest.mark.slow
def test_two_processes_train_like_one_process_on_two_devices(tmp_path, capsys):
    make_workspace(tmp_path)  # tokenized text and the "tiny" dataset entry under tmp_path/configs/
    config = tmp_path / "configs" / "tiny_x2.json"
    config.write_text(json.dumps(dict(TINY, model_path=str(tmp_path / "multi"))))
    ports = free_ports(4)  # all held at once, so all different
    cluster_file = tmp_path / "cluster.json"
    cluster_file.write_text(json.dumps({"worker": [f"127.0.0.1:{p}" for p in ports[:2]]}))
    lonely_file = tmp_path / "lonely.json"  # a worker whose chief never comes
    lonely_file.write_text(json.dumps({"worker": [f"127.0.0.1:{p}" for p in ports[2:]]}))

    lonely = start_main("--model", str(config), "--cluster", str(lonely_file), "--task_index", "1",
                        "--worker_timeout", "2", merge_stderr=True)
    worker = start_main("--model", str(config), "--cluster", str(cluster_file), "--task_index", "1",
                        "--worker_timeout", "240", merge_stderr=True)
    chief = start_main("--model", str(config), "--cluster", str(cluster_file), "--task_index", "0",
                       "--log_every", "1", "--peak_tflops", "1", merge_stderr=True)
    results = finish({"chief": chief, "worker": worker, "lonely worker": lonely},
                     {"chief": 300, "worker": 60, "lonely worker": 120})
    (chief_code, chief_out), (worker_code, worker_out) = results["chief"], results["worker"]
    lonely_code, lonely_out = results["lonely worker"]
    assert chief_code == 0, chief_out[-3000:]
    assert worker_code == 0 and "released by the chief" in worker_out, worker_out[-3000:]
    assert lonely_code == 3 and "exiting" in lonely_out, lonely_out[-3000:]  # gave up by itself
    assert "/job:worker/replica:0/task:1/device:CPU:0" in chief_out  # the mesh spans both processes

    # Both hosts did work: slices and their ops are placed on each task (the graph TensorBoard shows), and
    # each saved its checkpoint shard.
    devices = {node.device for node in training_graph(tmp_path / "multi").node}
    for task in (0, 1):
        assert f"/job:worker/replica:0/task:{task}/device:CPU:0" in devices
    assert (tmp_path / "multi" / "model.ckpt-3.data-00001-of-00002").exists()

    single_config = tmp_path / "configs" / "tiny_single.json"
    single_config.write_text(json.dumps(dict(TINY, model_path=str(tmp_path / "single"))))
    capsys.readouterr()
    assert main.main(["--model", str(single_config), "--gpu_ids", "device:CPU:0", "device:CPU:1",
                      "--log_every", "1", "--peak_tflops", "1"]) == 0
    single_out = capsys.readouterr().out

    multi_losses, single_losses = LOSS.findall(chief_out), LOSS.findall(single_out)
    assert [step for step, _ in multi_losses] == ["1", "2", "3"]
    assert multi_losses == single_losses
    multi, single = weights(tmp_path / "multi"), weights(tmp_path / "single")
    assert multi.keys() == single.keys() and len(multi) > 10
    for name in multi:
        # Equal up to summation order: two processes reduce in another order than one, and Adam's m / sqrt(v)
        # turns the last bit of a near-zero gradient into a step of up to lr (seen: one wte element of 131,072 off
        # by 2e-6, 2.2e-4 relative). So each tensor agrees in norm, and element-wise to a small part of its scale;
        # a host's gradient lost or counted twice moves whole tensors far beyond both.
        a, b = multi[name], single[name]
        assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b), name
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-3 * np.abs(b).max(), err_msg=name)


def test_cluster_from_files_and_flags(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}))
    c = cluster_lib.from_file(str(plain), 1)
    assert c.workers == ("10.0.0.1:2222", "10.0.0.2:2222") and not c.is_chief
    assert c.mesh_devices(["device:GPU:0", "device:GPU:1"]) == [
        "/job:worker/replica:0/task:0/device:GPU:0", "/job:worker/replica:0/task:0/device:GPU:1",
        "/job:worker/replica:0/task:1/device:GPU:0", "/job:worker/replica:0/task:1/device:GPU:1"]
    assert c.host_devices() == ["/job:worker/replica:0/task:0/device:CPU:0",
                                "/job:worker/replica:0/task:1/device:CPU:0"]
    tf_config = tmp_path / "tf_config.json"
    tf_config.write_text(json.dumps({"cluster": {"worker": ["a:1", "b:2", "c:3"]}, "task": {"type": "worker", "index": 2}}))
    assert cluster_lib.from_file(str(tf_config)).task_index == 2
    assert cluster_lib.from_flags("h0:5000, h1:5000", 0).is_chief

    for bad, message in ((dict(worker=["a:1", "a:1"]), "twice"), (dict(worker=["nohost"]), "host:port"),
                         (dict(worker=["a:1"], ps=["b:2"]), "only"), (dict(worker=[]), "workers")):
        plain.write_text(json.dumps(bad))
        with pytest.raises(DeviceError, match=message):
            cluster_lib.from_file(str(plain), 0)
    with pytest.raises(DeviceError, match="--task_index"):
        cluster_lib.from_flags("a:1,b:2", None)
    with pytest.raises(DeviceError, match="not a worker"):
        cluster_lib.from_flags("a:1,b:2", 2)
    with pytest.raises(DeviceError, match="not found"):
        cluster_lib.from_file(str(tmp_path / "missing.json"), 0)
    with pytest.raises(DeviceError, match="needs --cluster"):
        cluster_lib.find(task_index=1)


def test_chief_checks_the_mesh_against_the_cluster_before_starting():
    c = cluster_lib.from_flags("127.0.0.1:1,127.0.0.1:2", 0)
    with pytest.raises(DeviceError, match="the mesh has 8 devices but the cluster has 4"):
        cluster_lib.chief_placement(c, ["device:GPU:0", "device:GPU:1"], 8)


def test_unplaced_ops_go_to_the_chief_and_placed_ops_stay():
    fill = cluster_lib.ClusterPlacement(default_device="/job:worker/replica:0/task:0/device:CPU:0").device_function()
    assert Placement().device_function() is None
    with tf.Graph().as_default() as g, g.device(fill):
        free = tf.constant(1.0, name="free")
        with tf.device("/cpu:0"):
            partial = tf.constant(2.0, name="partial")
        with tf.device("/job:worker/replica:0/task:1/device:CPU:0"):
            pinned = tf.constant(3.0, name="pinned")
    assert free.device == "/job:worker/replica:0/task:0/device:CPU:0"
    assert partial.device == "/job:worker/replica:0/task:0/device:CPU:0"
    assert pinned.device == "/job:worker/replica:0/task:1/device:CPU:0"


def test_conflicting_flags_are_one_line_errors(capsys):
    assert main.main(["--model", "default", "--tpu", "my-tpu", "--workers", "a:1,b:2", "--task_index", "0"]) == 1
    assert "leave out --cluster" in capsys.readouterr().err
    assert main.main(["--model", "default", "--task_index", "1"]) == 1
    assert "needs --cluster" in capsys.readouterr().err
    assert main.main(["--model", "default", "--device_memory", "80GB"]) == 1
    assert "goes with --dry_run" in capsys.readouterr().err


@pytest.mark.parametrize("task", [0, 1])
def test_a_task_whose_port_is_taken_is_a_one_line_error_and_writes_nothing(tmp_path, capsys, task):
    """TensorFlow says only "Could not start gRPC server" (a traceback, before): the line names the task, its
    address and what holds the port. Bug caught: start_server's OpError not turned into a DeviceError."""
    config = make_workspace(tmp_path, mesh_shape="x:2", layout="batch:x")
    ports = free_ports(2)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports[task]))
        holder.listen(1)
        code = main.main(["--model", config, "--workers", ",".join(f"127.0.0.1:{p}" for p in ports),
                          "--task_index", str(task)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.strip() == (f"error: task {task} could not start its server at 127.0.0.1:{ports[task]} (port "
                           f"{ports[task]} is in use by another process): stop what holds the port, or give this task "
                           f"another one (in --workers or the cluster file; --cluster_port under SLURM)")
    assert not os.path.exists(tmp_path / "run")
