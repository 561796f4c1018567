"""Memory before the wait: training, --eval and --predict refuse up front when the dry run's estimate
(plan/dry_run.py) exceeds what this host has, instead of printing their start lines and growing until the kernel's
out-of-memory killer ends them.

What is compared, on one host (training: weights, optimizer state, gradients, activations; eval and predict: the
dry run's inference estimate, weights plus one batch's activations and predict's kv cache, no optimizer state):
* CPU devices: host RAM for the master copies (training: all variables; eval/predict: the weights) plus every
  CPU device's per-device total (the CPU's logical devices are host RAM), against the RAM available now:
  MemAvailable from /proc/meminfo (psutil's where there is no /proc), lowered to the container's cgroup limit
  where one is set (a Kubernetes pod's memory limit is not the machine's).
* GPUs: host RAM for the master copies against the same, and each GPU's per-device estimate against what the job
  can have of that GPU (`gpu_free_bytes`): nvidia-smi's free memory plus this process's own use, or with
  --gpu_memory FRACTION that share of its total. nvidia-smi, because TensorFlow reports what it uses
  (get_memory_info), not what is free. GPUs whose memory cannot be read are not compared. Not yet run on GPUs.
Multi-host runs and TPUs spread the master copies over their hosts and are not checked. `--ignore_memory_check`
goes on regardless (the estimate is an estimate: TensorFlow's allocator moves the real peak both ways).

The estimate answers in seconds at any depth: it comes from graphs of a few layers (dry_run.by_layer_kind: one
layer of each kind, and one more), the same per-tensor counts the whole model's graph gives. Only where it comes
within CLOSE of a limit is the whole graph built to decide (minutes for thousands of layers, where the answer
matters).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Optional

from schema import ConfigError, GPTConfig
from plan import dry_run
from plan.dry_run import human_bytes


CLOSE = 0.1  # an estimate within 10% of a limit is decided on the whole model's graph


def close_to(need: float, limit: float) -> bool:
    return abs(need - limit) <= CLOSE * limit


class DoesNotFit(ConfigError):
    """Training would not fit in this host's memory (one line: the numbers and what would make it fit)."""


def _meminfo_available() -> Optional[float]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil  # optional: macOS and other systems without /proc
    except ImportError:
        return None
    return float(psutil.virtual_memory().available)


CGROUP = "/sys/fs/cgroup"


def _cgroup_available() -> Optional[float]:
    """What the container's memory limit leaves (cgroup v2, then v1); None without a limit."""
    for limit_path, usage_path in ((f"{CGROUP}/memory.max", f"{CGROUP}/memory.current"),
                                   (f"{CGROUP}/memory/memory.limit_in_bytes", f"{CGROUP}/memory/memory.usage_in_bytes")):
        try:
            with open(limit_path) as f:
                limit = f.read().strip()
            with open(usage_path) as f:
                usage = float(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and float(limit) < 2 ** 60:  # "max", or v1's huge number: no limit
            return max(0.0, float(limit) - usage)
    return None


def available_host_bytes() -> Optional[float]:
    """RAM this process can still take: the smaller of the machine's available memory and the cgroup's; None when
    neither can be read."""
    found = [b for b in (_meminfo_available(), _cgroup_available()) if b is not None]
    return min(found) if found else None


def _nvidia_smi(query: str, columns: str) -> list:
    """Rows of `nvidia-smi --query-<query>=<columns>` as lists of strings; [] without nvidia-smi or when it fails."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", f"--query-{query}={columns}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[x.strip() for x in line.split(",")] for line in out.splitlines() if line.strip()]


def _nvidia_smi_memory() -> dict:
    """nvidia-smi's index -> (total, free, this process's use) in bytes per GPU; {} without nvidia-smi. This
    process's use counts as free: the GPU start-up check (devices/gpus.py) has already run TensorFlow on them."""
    mib = 2 ** 20
    own = {}
    for row in _nvidia_smi("compute-apps", "pid,gpu_bus_id,used_memory"):
        if len(row) == 3 and row[0] == str(os.getpid()) and row[2].isdigit():
            own[row[1]] = own.get(row[1], 0) + int(row[2]) * mib
    found = {}
    for row in _nvidia_smi("gpu", "index,pci.bus_id,memory.total,memory.free"):
        if len(row) == 4 and row[0].isdigit() and row[2].isdigit() and row[3].isdigit():
            found[int(row[0])] = (int(row[2]) * mib, int(row[3]) * mib, own.get(row[1], 0))
    return found


def _driver_index(physical: int) -> int:
    """nvidia-smi's index of CUDA's GPU `physical`: through CUDA_VISIBLE_DEVICES when it lists indices. (CUDA orders
    GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, nvidia-smi by bus: on machines of one GPU model, the
    usual case, the two agree.)"""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and all(v.isdigit() for v in visible) and physical < len(visible):
        return int(visible[physical])
    return physical


def gpu_free_bytes(placement, read=_nvidia_smi_memory) -> dict:
    """The mesh's GPU name -> the bytes the job can have on it, for the GPUs whose memory nvidia-smi reports: with
    --gpu_memory FRACTION that fraction of its total (TensorFlow reserves it for this process at start-up, so
    nvidia-smi's free memory no longer includes it), else its free memory plus what this process already holds."""
    setting = placement.gpu
    memory = read()
    free = {}
    for name in placement.devices:
        if "GPU" not in name.upper():
            continue
        physical = setting.physical_of(name) if setting is not None else int(name.rsplit(":", 1)[1])
        found = memory.get(_driver_index(physical))
        if found is None:
            continue
        total, left, own = found
        fraction = setting.memory.fraction if setting is not None and setting.memory is not None else None
        free[name] = fraction * total if fraction else left + own
    return free


def devices_short(need: float, free: dict) -> dict:
    """The devices (name -> free bytes) with less free memory than `need` bytes, the per-device estimate."""
    return {name: left for name, left in free.items() if left < need}


def _check_gpus(job: str, name: str, need: float, free: dict, advice: str) -> Optional[str]:
    """Raises DoesNotFit when a GPU has less free memory than the per-device estimate; the line saying what was
    compared, or None when no GPU's free memory is known."""
    if not free:
        return None
    short = devices_short(need, free)
    if short:
        worst = min(short, key=short.get)
        raise DoesNotFit(
            f"{job} {name} needs about {human_bytes(need)} per GPU (the dry run's estimate) but {worst} has "
            f"{human_bytes(short[worst])} free ({len(short)} of {len(free)} GPUs short): {advice}; or pass "
            f"--ignore_memory_check to try anyway")
    return f"{human_bytes(need)} per GPU needed, at least {human_bytes(min(free.values()))} free"


def host_need(plan: dry_run.Plan, on_cpu: bool, recompute: bool) -> float:
    """Host RAM for the training step: the master copies, plus on CPU devices every device's per-device total."""
    need = plan.facts.master_bytes
    if on_cpu:
        need += plan.cfg.n_devices * plan.memory[recompute].total
    return need


def _advice(plan: dry_run.Plan, on_cpu: bool, available: float, name: str) -> str:
    cfg = plan.cfg
    if on_cpu and not cfg.recompute_grad and host_need(plan, on_cpu, True) <= available:
        return (f"set \"recompute_grad\": true in the config (then about "
                f"{human_bytes(host_need(plan, on_cpu, True))})")
    if on_cpu:
        m = plan.memory[cfg.recompute_grad]
        fixed = plan.facts.master_bytes + cfg.n_devices * (m.total - m.activations)
        if fixed <= available:
            return (f"lower train_batch_size or n_ctx (activations take {human_bytes(cfg.n_devices * m.activations)}"
                    f"{'' if cfg.recompute_grad else '; recompute_grad: true also saves some'})")
        return (f"the weights, optimizer state and gradients alone take {human_bytes(fixed)}: train a smaller model "
                f"here, or on GPUs or TPUs (python main.py --model {name} --dry_run --device_memory 80GB finds the "
                f"smallest mesh that fits)")
    return (f"the master copies of the weights and {cfg.opt_name} state live in host RAM: use a host with more RAM, "
            f"spread them over several hosts (multi-host training), or train a smaller model")


def check_training(cfg: GPTConfig, placement, name: str, available: Optional[float] = None,
                   gpu_free: Optional[dict] = None) -> Optional[str]:
    """Raises DoesNotFit when training cfg on `placement` needs more host RAM than is available, or more of a GPU
    than it has free (`gpu_free`: name -> bytes, read from nvidia-smi when None); returns a line saying what was
    compared (None when nothing was: multi-host, TPU, or no way to read the available memory)."""
    if not placement.on_this_host:  # a cluster's hosts, a TPU's: not this host's RAM and GPUs
        return None
    available = available_host_bytes() if available is None else available
    if available is None:
        return None
    on_cpu = not any("GPU" in d.upper() for d in placement.devices)
    gpu_free = {} if on_cpu else gpu_free_bytes(placement) if gpu_free is None else gpu_free

    def close(plan) -> bool:
        return (close_to(host_need(plan, on_cpu, cfg.recompute_grad), available)
                or bool(gpu_free) and close_to(plan.memory[cfg.recompute_grad].total, min(gpu_free.values())))

    plan = dry_run.make_plan(cfg, facts=dry_run.by_layer_kind(cfg))
    if close(plan):
        plan = dry_run.make_plan(cfg)
    need = host_need(plan, on_cpu, cfg.recompute_grad)
    what = (f"the master copies plus {cfg.n_devices} CPU device{'s' if cfg.n_devices > 1 else ''} x "
            f"{human_bytes(plan.memory[cfg.recompute_grad].total)}" if on_cpu else "the master copies of all variables")
    if need > available:
        raise DoesNotFit(
            f"training {name} needs about {human_bytes(need)} of host RAM ({what}; the dry run's estimate, "
            f"recompute_grad {'on' if cfg.recompute_grad else 'off'}) but {human_bytes(available)} is available: "
            f"{_advice(plan, on_cpu, available, name)}; or pass --ignore_memory_check to try anyway")
    said = f"memory: about {human_bytes(need)} of host RAM needed, {human_bytes(available)} available"
    if on_cpu:
        return said
    per_device = plan.memory[cfg.recompute_grad]
    advice = (f"set \"recompute_grad\": true in the config (then about {human_bytes(plan.memory[True].total)})"
              if not cfg.recompute_grad and plan.memory[True].total < per_device.total else
              f"python main.py --model {name} --dry_run --device_memory <one GPU's memory> finds a mesh and layout "
              f"that fit")
    gpus = _check_gpus("training", name, per_device.total, gpu_free, advice)
    return f"{said}; {gpus}" if gpus else said


def inference_host_need(plan_facts: dry_run.GraphFacts, per_device: dry_run.InferenceMemory, n_devices: int,
                        on_cpu: bool) -> float:
    """Host RAM for --eval/--predict: the master copies of the weights, plus on CPU devices every device's total."""
    return plan_facts.master_weight_bytes + (n_devices * per_device.total if on_cpu else 0.0)


def check_inference(cfg: GPTConfig, placement, name: str, job: str, available: Optional[float] = None,
                    gpu_free: Optional[dict] = None) -> Optional[str]:
    """check_training for --eval (job "eval") and --predict ("predict"), with the dry run's inference estimate:
    weights, one batch's activations and predict's kv cache; no optimizer state, no gradients."""
    if not placement.on_this_host:  # a cluster's hosts, a TPU's: not this host's RAM and GPUs
        return None
    available = available_host_bytes() if available is None else available
    if available is None:
        return None
    on_cpu = not any("GPU" in d.upper() for d in placement.devices)
    gpu_free = {} if on_cpu else gpu_free_bytes(placement) if gpu_free is None else gpu_free
    facts = dry_run.by_layer_kind(cfg, recompute_flags=(False,))
    try:
        per_device = dry_run.inference_memory(facts, cfg, job)
    except ConfigError:
        return None  # a batch the layout cannot split: the job itself says so, in its own words
    if (close_to(inference_host_need(facts, per_device, cfg.n_devices, on_cpu), available)
            or bool(gpu_free) and close_to(per_device.total, min(gpu_free.values()))):
        facts = dry_run.collect(cfg, recompute_flags=(False,))
        per_device = dry_run.inference_memory(facts, cfg, job)
    need = inference_host_need(facts, per_device, cfg.n_devices, on_cpu)
    batch_key = "eval_batch_size" if job == "eval" else "predict_batch_size"
    doing = "evaluating" if job == "eval" else "predicting with"
    if need > available:
        weights = inference_host_need(facts, dry_run.InferenceMemory(job, 0, per_device.weights,
                                                                     per_device.weight_casts, 0.0, 0.0),
                                      cfg.n_devices, on_cpu)
        advice = (f"lower {batch_key}{' or n_ctx' if job == 'predict' else ''} (the weights take "
                  f"{human_bytes(weights)})" if weights <= available else
                  f"the weights alone take {human_bytes(weights)}: use a host with more RAM, or GPUs")
        raise DoesNotFit(
            f"{doing} {name} needs about {human_bytes(need)} of host RAM (the dry run's inference estimate: weights"
            f"{', kv cache' if per_device.kv_cache else ''} and activations at {batch_key} {per_device.batch_size}) "
            f"but {human_bytes(available)} is available: {advice}; or pass --ignore_memory_check to try anyway")
    said = f"memory: about {human_bytes(need)} of host RAM needed, {human_bytes(available)} available"
    if on_cpu:
        return said
    gpus = _check_gpus(doing, name, per_device.total, gpu_free,
                       f"lower {batch_key}, or spread the model over more GPUs (--mesh_shape, --layout)")
    return f"{said}; {gpus}" if gpus else said
