"""The cluster from the launcher's environment (issue 22): TF_CONFIG (Kubernetes' training operators, Ray, Vertex
AI) and SLURM's srun variables, resolved by pure functions on synthetic environments, and two tasks trained on
loopback from each; --cluster/--workers override the environment."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from ports import loopback_ports

from modelpath import checkpoints
from devices import cluster as cluster_lib
from devices.placement import DeviceError
from workspace import REPO, make_workspace, run_python, start_main, wait_for_line


def flags(**given):
    """devices/cluster.py's `find` arguments: the multi-host flags (none given by default)."""
    values = dict(cluster_file=None, workers=None, task_index=None, port=None, on_tpu=False)
    values.update(given)
    return values


def tf_config(cluster, kind, index):
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


def test_tf_config_chief_first_then_workers():
    spec = {"chief": ["c:1"], "worker": ["w0:2", "w1:3"]}
    for kind, index, task in (("chief", 0, 0), ("worker", 0, 1), ("worker", 1, 2)):
        c = cluster_lib.from_tf_config(tf_config(spec, kind, index))
        assert c.workers == ("c:1", "w0:2", "w1:3") and c.task_index == task and c.source == "TF_CONFIG"
    ray = cluster_lib.from_tf_config(tf_config({"worker": ["a:1", "b:1"]}, "worker", 1))  # Ray, Vertex: workers only
    assert ray.workers == ("a:1", "b:1") and ray.task_index == 1
    master = cluster_lib.from_tf_config(tf_config({"master": ["m:1"], "worker": ["w:1"]}, "master", 0))
    assert master.is_chief and master.workers == ("m:1", "w:1")
    assert cluster_lib.from_tf_config(tf_config({"worker": ["only:1"]}, "worker", 0)) is None  # one host
    assert cluster_lib.from_tf_config(tf_config(spec, "worker", 1), task_index=0).is_chief  # --task_index wins
    for bad, message in (("{not json", "not valid JSON"), (json.dumps({"task": {}}), "no \"cluster\""),
                         (tf_config({"worker": ["a:1"], "ps": ["p:1"]}, "worker", 0), "parameter servers"),
                         (tf_config({"chief": ["a:1", "b:1"]}, "chief", 0), "one chief"),
                         (tf_config(spec, "evaluator", 0), "not a task"),
                         (tf_config(spec, "worker", 2), "not a worker")):
        with pytest.raises(DeviceError, match=message):
            cluster_lib.from_tf_config(bad)


def test_slurm_host_lists_and_tasks_per_node():
    assert cluster_lib.expand_hostlist("node[01-03,07],gpu-a1,rack[1-2]-n[1-2]") == [
        "node01", "node02", "node03", "node07", "gpu-a1", "rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
    assert cluster_lib.expand_hostlist("n[8-10]") == ["n8", "n9", "n10"]
    assert cluster_lib.tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(DeviceError, match="not understood"):
        cluster_lib.tasks_per_node("2(y3)")


def test_slurm_environment_gives_each_task_its_address():
    env = {"SLURM_JOB_ID": "42", "SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NODELIST": "gn[1-2]",
           "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_NODELIST": "gn[1-9]", "SLURM_NTASKS": "18"}
    c = cluster_lib.from_slurm(env)
    assert c.workers == ("gn1:8888", "gn1:8889", "gn2:8888", "gn2:8889") and c.task_index == 3
    assert c.source == "SLURM job 42"
    assert cluster_lib.from_slurm(env, port=5000).workers[1] == "gn1:5001"
    # Without the step's variables (an older SLURM) the job's serve.
    job_only = {"SLURM_PROCID": "1", "SLURM_NTASKS": "3", "SLURM_JOB_NODELIST": "a,b", "SLURM_TASKS_PER_NODE": "2,1"}
    assert cluster_lib.from_slurm(job_only).workers == ("a:8888", "a:8889", "b:8888")
    assert cluster_lib.from_slurm({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "a"}) is None
    assert cluster_lib.from_slurm({"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "a,b"}) is None  # sbatch, no srun
    with pytest.raises(DeviceError, match="does not add up"):
        cluster_lib.from_slurm(dict(job_only, SLURM_TASKS_PER_NODE="1,1"))


def test_flags_override_the_environment_and_the_environment_overrides_nothing_on_a_tpu(tmp_path):
    env = {"TF_CONFIG": tf_config({"worker": ["a:1", "b:1"]}, "worker", 1),
           "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "s[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)"}
    assert cluster_lib.find(**flags(), env=env).source == "TF_CONFIG"  # TF_CONFIG before SLURM
    assert cluster_lib.find(**flags(), env=dict(env, TF_CONFIG="")).workers == ("s1:8888", "s2:8888")
    assert cluster_lib.find(**flags(workers="x:1,y:1", task_index=0), env=env).workers == ("x:1", "y:1")
    assert cluster_lib.find(**flags(task_index=0), env=env).is_chief
    assert cluster_lib.find(**flags(on_tpu=True), env=env) is None
    assert cluster_lib.find(**flags(), env={}) is None
    with pytest.raises(DeviceError, match="needs --cluster"):
        cluster_lib.find(**flags(task_index=1), env={})
    line = cluster_lib.describe(cluster_lib.find(**flags(), env=env))
    assert line == "cluster of 2 tasks from TF_CONFIG: this is task 1 (a worker) at b:1"


def free_port_pair():
    """A port p with p + 1 free too (SLURM's layout: a node's tasks on consecutive ports)."""
    return loopback_ports(2)[0]


# Imported by the chief's Python at start-up (PYTHONPATH): a thread that never ends, which interpreter shutdown
# waits for, as it can wait for a TF gRPC server's threads.
LINGERING_THREAD = "import threading\nthreading.Thread(target=threading.Event().wait, name='lingering').start()\n"


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["TF_CONFIG", "SLURM"])
def test_two_tasks_train_on_loopback_from_the_launchers_environment(tmp_path, launcher):
    """Two tasks from the launcher's environment train one step together; the chief, whose process holds a thread
    that never ends, still releases its worker and exits. Bug caught: main.py leaving by sys.exit on a chief
    (main.leave not called): the chief blocks in interpreter shutdown and the test times out."""
    config = make_workspace(tmp_path, n_layer=1, attention_types=[[["global"], 1]], train_steps=1,
                            steps_per_checkpoint=1, mesh_shape="x:2", layout="batch:x")
    port = free_port_pair()
    base = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    base.update(TF_CPP_MIN_LOG_LEVEL="3")
    envs = []
    for task in (0, 1):
        if launcher == "TF_CONFIG":
            spec = {"chief": [f"127.0.0.1:{port}"], "worker": [f"127.0.0.1:{port + 1}"]}
            envs.append(dict(base, TF_CONFIG=tf_config(spec, "chief" if task == 0 else "worker", 0)))
        else:
            envs.append(dict(base, SLURM_JOB_ID="7", SLURM_PROCID=str(task), SLURM_STEP_NUM_TASKS="2",
                             SLURM_STEP_NODELIST="127.0.0.1", SLURM_STEP_TASKS_PER_NODE="2"))
    lingering = tmp_path / "lingering"
    lingering.mkdir()
    (lingering / "sitecustomize.py").write_text(LINGERING_THREAD)
    envs[0]["PYTHONPATH"] = str(lingering)
    extra = ["--cluster_port", str(port)] if launcher == "SLURM" else []
    processes = [start_main("--model", config, "--peak_tflops", "1", *extra,
                            *(["--worker_timeout", "240"] if task else []), env=envs[task], merge_stderr=True)
                 for task in (1, 0)]
    try:
        worker_out, chief_out = (p.communicate(timeout=240)[0] for p in processes)
    except subprocess.TimeoutExpired:  # both tasks' own words on what they waited for
        for p in processes:
            p.kill()
        worker_out, chief_out = (p.communicate()[0] for p in processes)
        pytest.fail(f"the tasks did not end within 240 s; the worker printed:\n{worker_out[-3000:]}\n"
                    f"the chief printed:\n{chief_out[-3000:]}")
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
    worker, chief = processes
    source = "TF_CONFIG" if launcher == "TF_CONFIG" else "SLURM job 7"
    assert chief.returncode == 0, chief_out[-3000:]
    assert worker.returncode == 0 and "released by the chief" in worker_out, worker_out[-3000:]
    assert f"cluster of 2 tasks from {source}: this is task 0 (the chief) at 127.0.0.1:{port}" in chief_out
    assert f"cluster of 2 tasks from {source}: this is task 1 (a worker) at 127.0.0.1:{port + 1}" in worker_out
    model_path = str(tmp_path / "run")
    assert checkpoints.steps(model_path) == [1]
    assert os.path.exists(checkpoints.prefix_of(model_path, 1) + ".data-00001-of-00002")  # the worker's shard



def _srun_problem():
    """Why the srun test cannot run here, or None."""
    if shutil.which("srun") is None:
        return "srun is not installed (tools/slurm_localhost.sh sets up a one-node SLURM on Debian/Ubuntu)"
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo does not answer ({type(e).__name__})"
    if not any(state.strip() in ("idle", "mixed") for state in states.splitlines()):
        return f"no idle SLURM node (sinfo: {states.strip() or 'nothing'}): start one with tools/slurm_localhost.sh"
    return None


def test_srun_two_tasks_train_like_the_loopback_ones(tmp_path):
    problem = _srun_problem()  # here, not at collection: sinfo may wait for a controller that is not running
    if problem:
        pytest.skip(problem)
    config = make_workspace(tmp_path, n_layer=1, attention_types=[[["global"], 1]], train_steps=1,
                            steps_per_checkpoint=1, mesh_shape="x:2", layout="batch:x")
    port = free_port_pair()
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    env.update(TF_CPP_MIN_LOG_LEVEL="3")
    run = subprocess.run(["srun", "-n", "2", "--nodes", "1", "--time", "10", "--label", sys.executable,
                          os.path.join(REPO, "main.py"), "--model", config, "--peak_tflops", "1", "--cluster_port",
                          str(port), "--worker_timeout", "240"], capture_output=True, text=True, cwd=REPO, env=env,
                         timeout=400)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert "0: cluster of 2 tasks from SLURM job" in out and "this is task 0 (the chief)" in out, out[-3000:]
    assert "1: cluster of 2 tasks from SLURM job" in out and "this is task 1 (a worker)" in out, out[-3000:]
    assert checkpoints.steps(str(tmp_path / "run")) == [1]
    assert os.path.exists(checkpoints.prefix_of(str(tmp_path / "run"), 1) + ".data-00001-of-00002")


@pytest.mark.slow
def test_a_worker_leaves_after_its_timeout_even_when_tensorflows_wait_never_returns():
    """TensorFlow does not always honour a call's deadline in a cluster (tensorflow/tensorflow#14489): a worker
    whose wait hangs inside the runtime still leaves, with exit code 3 and a line saying why, WATCHDOG_GRACE after
    --worker_timeout. Here the session's call never returns (it sleeps, releasing the GIL as TF's calls do).
    The bug it guards: a worker outliving its timeout (seen once in test_multihost, silent 120 s past 2)."""
    ports = loopback_ports(2)
    code = f"""
import time
import tensorflow.compat.v1 as tf
from devices import cluster
tf.Session.run = lambda *args, **kwargs: time.sleep(3600)  # a wait that never comes back
cluster.WATCHDOG_GRACE = 0.5
lonely = cluster.Cluster(workers=("127.0.0.1:{ports[0]}", "127.0.0.1:{ports[1]}"), task_index=1)
cluster.serve(lonely, cluster.start_server(lonely, ["device:CPU:0"]), timeout=1.0)
print("serve returned")
"""
    result = run_python(code, timeout=120)
    assert result.returncode == 3, result.stdout + result.stderr[-2000:]
    assert "no release from the chief within 1 s, and TensorFlow's wait did not return" in result.stdout
    assert "serve returned" not in result.stdout


# A chief's server and its release of worker 1, timed; the worker's address is `ports[1]`.
RELEASING_CHIEF = """
import sys, time
import tensorflow.compat.v1 as tf
from devices import cluster
ports = [int(p) for p in sys.argv[1:3]]
pair = cluster.Cluster(workers=tuple(f"127.0.0.1:{{p}}" for p in ports), task_index=0)
server = cluster.start_server(pair, ["device:CPU:0"])
{before}
start = time.monotonic()
cluster.release_workers(pair, server, timeout_s={timeout})
print(f"released in {{time.monotonic() - start:.1f}} s", flush=True)
cluster.exit_process(0)
"""


def _release_seconds(result) -> float:
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    return float(result.stdout.split("released in ")[1].split()[0])


@pytest.mark.slow
def test_a_chief_whose_worker_never_came_leaves_at_the_release_timeout():
    """The chief's release of a worker that is not there: TensorFlow's session creation waits for every task
    without a limit (its call's deadline is not honoured), so the chief stops waiting at the release's timeout and
    leaves with a line saying so. Bug caught: releasing on the chief's own thread (the chief never exits)."""
    ports = loopback_ports(2)
    result = run_python(RELEASING_CHIEF.format(before="", timeout=3), *map(str, ports), timeout=120)
    assert _release_seconds(result) < 10
    assert "could not release the workers within 3 s" in result.stderr


@pytest.mark.slow
def test_a_chief_whose_worker_ends_during_its_release_leaves_at_once(tmp_path):
    """The failure CI met (stop 63): worker 1 ends while the chief's release call to it is in flight (there it had
    taken the release and exited before the call's answer). The call fails with UnavailableError, and closing
    the session after that blocks inside TensorFlow: the chief reports the worker and leaves without waiting on
    the close. Here the worker's release queue is filled first, so the release waits; the worker ends 2 s after
    the chief says it filled the queue. Bug caught: the session closed before the chief stops waiting (it then
    leaves only at the 90 s timeout)."""
    ports = loopback_ports(2)
    filled = tmp_path / "filled"
    worker = subprocess.Popen(
        [sys.executable, "-c", "import os, sys, time\nfrom devices import cluster\n"
         f"me = cluster.Cluster(workers=('127.0.0.1:{ports[0]}', '127.0.0.1:{ports[1]}'), task_index=1)\n"
         "cluster.start_server(me, ['device:CPU:0'])\n"
         f"end = time.monotonic() + 150\nwhile not os.path.exists({str(filled)!r}) and time.monotonic() < end:\n"
         "    time.sleep(0.1)\ntime.sleep(2)\nos._exit(0)\n"],
        cwd=REPO, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO))
    fill = f"""
with tf.Graph().as_default():
    queue = cluster._release_queue(pair, 1)
    filling = tf.Session(server.target)
    filling.run([queue.enqueue(0) for _ in range(pair.size)])  # full: the release's enqueue waits
open({str(filled)!r}, "w").close()  # the worker ends 2 s later, the release's call in flight
"""
    try:
        result = run_python(RELEASING_CHIEF.format(before=fill, timeout=90), *map(str, ports), timeout=200)
    finally:
        worker.kill()
        worker.wait()
    assert _release_seconds(result) < 30
    assert "could not release worker 1 (UnavailableError): it has ended or cannot be reached" in result.stderr


def train_then_kill(tmp_path, victim: int) -> tuple:
    """Two tasks on loopback train without end; two seconds after the chief's step 1 (mid-training, and seen by
    both tasks' watches: a task never reached is not judged), task `victim` is killed -9. Returns the other
    task's (exit code, output) once it ends (90 s at most), and the victim's address."""
    config = make_workspace(tmp_path, n_layer=1, attention_types=[[["global"], 1]], train_steps=100000,
                            steps_per_checkpoint=100000, mesh_shape="x:2", layout="batch:x")
    addresses = [f"127.0.0.1:{p}" for p in loopback_ports(2)]
    worker = start_main("--model", config, "--workers", ",".join(addresses), "--task_index", "1", merge_stderr=True)
    chief = start_main("--model", config, "--workers", ",".join(addresses), "--task_index", "0", "--peak_tflops",
                       "1", merge_stderr=True)
    killed, survivor = (chief, worker) if victim == 0 else (worker, chief)
    try:
        wait_for_line(chief, r"step +1/")
        time.sleep(2)
        killed.kill()
        killed.wait()
        out = survivor.communicate(timeout=90)[0]
    finally:
        for p in (worker, chief):
            if p.poll() is None:
                p.kill()
                p.wait()
    return survivor.returncode, out, addresses[victim]


@pytest.mark.slow
def test_a_chief_whose_worker_is_killed_mid_training_ends_with_one_error_line(tmp_path):
    """A worker killed -9 while the chief trains (its host lost): TensorFlow leaves the chief's step waiting for it
    without a limit, so the chief's watch (devices/task_watch.py) finds the worker gone and ends the chief
    with one error line and exit code 1, seconds later; or, killed while the step waits on it, the step fails
    with UnavailableError (`lost_task`, below), and the chief ends the same way. Bug caught: the watch never
    started (the chief hangs)."""
    code, chief_out, address = train_then_kill(tmp_path, victim=1)
    assert code == 1, chief_out[-3000:]
    assert (f"error: worker 1 ({address}) is gone: its server stopped answering (connection refused)"
            in chief_out), chief_out[-3000:]
    assert "Traceback" not in chief_out, chief_out[-3000:]


# What a chief's step raised when its worker was killed while the step waited on it (a suite run, 2026-12-07)
SOCKET_CLOSED = ("Graph execution error:\n\n=====================\nUNAVAILABLE: From /job:worker/replica:0/task:1:\n"
                 "Socket closed\nAdditional GRPC error information from remote target /job:worker/replica:0/task:1 "
                 "while calling /tensorflow.WorkerService/RunGraph:\nUNAVAILABLE: From /job:worker/replica:0/task:0:\n"
                 "Socket closed\n")


def leading(monkeypatch, workers):
    """This process as the chief of a cluster of `workers` ("host:port", the chief's first), its exit recorded
    (SystemExit) instead of made; no probe waits between rounds."""
    cluster = cluster_lib.Cluster(workers=tuple(workers), task_index=0)
    monkeypatch.setattr(cluster_lib, "_held", [(cluster, None, None)])
    monkeypatch.setattr(cluster_lib, "PROBE_INTERVAL_S", 0.0)
    monkeypatch.setattr(cluster_lib, "exit_process", lambda code: (_ for _ in ()).throw(SystemExit(code)))


@pytest.mark.parametrize("message", [SOCKET_CLOSED, SOCKET_CLOSED.replace("task:1", "task:0"), "Socket closed"],
                         ids=["as_seen", "only_the_chief_named", "no_task_named"])
def test_a_step_that_lost_a_killed_worker_ends_the_chief_as_its_watch_would(monkeypatch, capsys, message):
    """A step that failed with UnavailableError while a worker now refuses connections: the watch's line and exit
    code 1, not a traceback, whichever tasks the error names (the chief's own is no worker to probe) or none.
    Bug caught: main.py leaving UnavailableError to Python (seen: a traceback, then 30 s spent releasing the dead
    worker)."""
    import tensorflow.compat.v1 as tf
    import main
    from tests.devices.test_task_watch import listening, unused_address
    chief, chief_address = listening()
    gone = unused_address()
    leading(monkeypatch, [chief_address, gone])
    monkeypatch.setattr(main, "run", lambda args: (_ for _ in ()).throw(
        tf.errors.UnavailableError(None, None, message)))
    try:
        with pytest.raises(SystemExit) as exited:
            main.main(["--model", "any"])
    finally:
        chief.close()
    assert exited.value.code == 1
    assert (f"error: worker 1 ({gone}) is gone: its server stopped answering (connection refused)"
            in capsys.readouterr().err)


def test_a_step_that_lost_a_task_still_answering_is_one_line_naming_the_task(monkeypatch, capsys):
    """UnavailableError while every worker still answers (a network cut, a task restarting): one `error:` line
    naming the task and what TensorFlow said, exit code 1, and the workers released as after any run. Outside a
    cluster's chief the error is not ours to explain and goes up as it came."""
    import tensorflow.compat.v1 as tf
    import main
    from tests.devices.test_task_watch import listening
    servers = [listening() for _ in range(2)]
    error = tf.errors.UnavailableError(None, None, SOCKET_CLOSED)
    monkeypatch.setattr(main, "run", lambda args: (_ for _ in ()).throw(error))
    with pytest.raises(tf.errors.UnavailableError):
        main.main(["--model", "any"])  # no cluster held
    leading(monkeypatch, [address for _, address in servers])
    try:
        assert main.main(["--model", "any"]) == 1
    finally:
        for server, _ in servers:
            server.close()
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: a task of the cluster could not be reached during a session call (task 1: Socket closed): check "
        "that every task is running and that the hosts reach each other, then start every task again to resume "
        "from the last checkpoint")


@pytest.mark.slow
def test_a_worker_whose_chief_is_killed_mid_training_leaves_with_a_line(tmp_path):
    """The chief killed -9 while it trains: its worker, which waits for a release by default (no
    --worker_timeout), would hold its host for good; its watch finds the chief gone and it leaves with exit code
    3 and a line saying why. Bug caught: the worker not looking at its watch's finding (it waits on)."""
    code, worker_out, chief_address = train_then_kill(tmp_path, victim=0)
    assert code == 3, worker_out[-3000:]
    assert (f"worker 1: the chief ({chief_address}) is gone: its server stopped answering (connection refused); "
            f"exiting unreleased" in worker_out), worker_out[-3000:]


@pytest.mark.slow
def test_a_chief_whose_job_raises_still_releases_and_exits(tmp_path):
    """An exception no job turns into a line (a bug; an error of TensorFlow's, such as a GPU out of memory on a
    worker) in a chief: its traceback, then main.leave as after any run, so the process ends although interpreter
    shutdown would block (here a thread that never ends; a TF gRPC server's can). Bug caught: main.py's
    `__main__` leaving the exception to Python (the chief blocks after its traceback)."""
    config = make_workspace(tmp_path, n_layer=1, attention_types=[[["global"], 1]], mesh_shape="x:2",
                            layout="batch:x")
    lingering = tmp_path / "lingering"
    lingering.mkdir()
    (lingering / "sitecustomize.py").write_text(LINGERING_THREAD)
    ports = loopback_ports(2)
    code = f"""
import runpy, sys
import jobs
from devices import cluster
def boom(*args):
    raise RuntimeError("a job's unexpected error")
jobs.Training.run = boom
cluster.RELEASE_TIMEOUT_S = 2  # its worker never came
sys.argv = ["main.py", "--model", {config!r}, "--workers", "127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}",
            "--task_index", "0"]
runpy.run_path("main.py", run_name="__main__")
"""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=f"{REPO}{os.pathsep}{lingering}")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env,
                            timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert "RuntimeError: a job's unexpected error" in result.stderr
    assert "could not release the workers within 2 s" in result.stderr
