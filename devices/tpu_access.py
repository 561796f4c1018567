"""--tpu local|colab|NAME|grpc://host:port: which TPU is meant, whether this machine can reach it, and the one line
that says what is missing when it cannot.

Reaching a TPU takes several things that fail far apart and late in TensorFlow (a segfault, a `ValueError`
traceback, a session that waits for minutes on an address nobody answers). Here they are gathered first as
`TpuFacts` (`gather_facts`, bounded by --tpu_timeout) and judged by pure functions (`target`, `tpu_problem`,
`generation_problem`), tested on the CPU (tests/devices/test_tpu_access.py):

* `local`: the TPU attached to this VM (a Cloud TPU VM). Needs TensorFlow's TPU build (`tensorflow-tpu`, which
  loads libtpu; the plain `tensorflow` wheel cannot) and the TPU's device files; its hosts' job is `localhost`.
* `grpc://host:port`: a TPU Node's worker; it must answer within the timeout. The job is `worker`.
* `NAME`: a TPU Node looked up through the Cloud TPU API from a Google Cloud VM: needs the resolver's packages
  (cloud-tpu-client, google-api-python-client, oauth2client) and the VM's metadata server.
* `colab`: Colab's TPU: the TPU Node in COLAB_TPU_ADDR where Colab sets it, else this runtime's own TPU (local).

Only the TPU generations whose TensorFlow runtime runs session-style replicated programs are accepted (docs/tpus.md,
"Which TPUs"): v2, v3 and v4 with the stream-executor runtime. v5e, v5p and v6e run TensorFlow only through PJRT.
"""
from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import re
import socket
import threading
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlparse

from devices.errors import DeviceError

INSTALL = "pip install -r requirements-tpu.txt"
DEFAULT_TIMEOUT = 20.0  # seconds for an address (or the metadata server) to answer
METADATA_HOST = "metadata.google.internal"
RESOLVER_MODULES = ("googleapiclient", "oauth2client")
SUPPORTED_GENERATIONS = ("v2", "v3", "v4")


@dataclass(frozen=True)
class Target:
    """The TPU meant by --tpu: `kind` is local, grpc or name; `address` is what TPUClusterResolver gets; `job` the
    TensorFlow job of the TPU's hosts."""
    kind: str
    address: str
    job: str
    given: str = ""  # the --tpu argument as the user wrote it, for messages


def target(tpu: str, colab_tpu_addr: Optional[str] = None) -> Target:
    """The --tpu argument as a Target (colab: COLAB_TPU_ADDR's TPU Node where set, else this runtime's TPU)."""
    tpu = (tpu or "").strip()
    if not tpu:
        raise DeviceError("--tpu needs the TPU: local (a TPU VM), its name, grpc://host:port (a TPU Node) or colab")
    if tpu == "colab":
        if colab_tpu_addr:
            node = target(colab_tpu_addr if colab_tpu_addr.startswith("grpc://") else f"grpc://{colab_tpu_addr}")
            return Target(node.kind, node.address, node.job, "colab")
        return Target("local", "local", "localhost", "colab")
    if tpu == "local":
        return Target("local", "local", "localhost", tpu)
    if tpu.startswith("grpc://"):
        parsed = urlparse(tpu)
        try:
            port = parsed.port
        except ValueError:
            port = None
        if not parsed.hostname or not port:
            raise DeviceError(f"--tpu {tpu!r}: write a TPU Node's address as grpc://HOST:PORT "
                              f"(e.g. grpc://10.0.0.2:8470)")
        return Target("grpc", tpu, "worker", tpu)
    if "://" in tpu or "/" in tpu:
        raise DeviceError(f"--tpu {tpu!r} is not understood: local, a TPU name, grpc://HOST:PORT or colab")
    return Target("name", tpu, "worker", tpu)


def host_port(address: str) -> tuple:
    parsed = urlparse(address)
    return parsed.hostname, parsed.port


@dataclass(frozen=True)
class TpuFacts:
    """What decides whether --tpu can work on this machine, gathered before TensorFlow touches the TPU."""
    tensorflow: str = "tensorflow"              # the TensorFlow distribution: tensorflow, tensorflow-tpu, ...
    tensorflow_version: str = ""
    libtpu: Optional[str] = None                # libtpu's version, when installed
    resolver_packages: tuple = ()               # RESOLVER_MODULES that are missing
    tpu_device_files: int = 0                   # /dev/accel* (v2-v4) and /dev/vfio/N (v5e and later)
    accelerator_type: Optional[str] = None      # e.g. v4-8, v5litepod-8 (TPU_ACCELERATOR_TYPE on TPU VMs)
    address_answers: Optional[bool] = None      # grpc: whether host:port accepted a connection in time
    metadata_answers: Optional[bool] = None     # name: whether the Google Cloud metadata server answered in time


def tpu_problem(want: Target, facts: TpuFacts, timeout: float = DEFAULT_TIMEOUT) -> Optional[str]:
    """Why `want` cannot be reached from here, as one line naming the fix; None when nothing is known missing."""
    if want.kind == "local":
        if facts.tensorflow != "tensorflow-tpu":
            return (f"--tpu {want.given} needs TensorFlow's TPU build, which loads libtpu: this is {facts.tensorflow} "
                    f"{facts.tensorflow_version}, which cannot use a TPU; on the TPU VM, in a fresh venv: `{INSTALL}`")
        if not facts.libtpu:
            return f"--tpu {want.given}: libtpu (the TPU runtime tensorflow-tpu loads) is not installed: `{INSTALL}`"
        if facts.tpu_device_files == 0:
            return (f"--tpu {want.given}: this machine has no TPU (no /dev/accel* or /dev/vfio device): run on a "
                    f"Cloud TPU VM (or, in Colab, a TPU runtime), or pass a TPU Node as --tpu NAME or grpc://HOST:PORT")
        return generation_problem(facts.accelerator_type)
    if want.kind == "grpc":
        if facts.address_answers is False:
            return (f"--tpu {want.given}: nothing answered there within {timeout:g} s: check the TPU Node's address "
                    f"and port (8470), that it is running and that this VM's network reaches it, or wait longer "
                    f"with --tpu_timeout SECONDS")
        return None
    if facts.resolver_packages:
        return (f"--tpu {want.given}: looking up a TPU by name needs {', '.join(facts.resolver_packages)} (the "
                f"Cloud TPU API client): `{INSTALL}`; or pass the TPU Node's address as grpc://HOST:8470")
    if facts.metadata_answers is False:
        return (f"--tpu {want.given}: a TPU name is looked up from a Google Cloud VM (its metadata server, "
                f"{METADATA_HOST}, did not answer within {timeout:g} s): run on a VM in the TPU's project and zone, "
                f"pass the TPU Node's address as grpc://HOST:8470, or --tpu local on a TPU VM")
    return None


def generation_problem(accelerator_type: Optional[str]) -> Optional[str]:
    """TPU v5e/v5p/v6e (and later) run TensorFlow through the PJRT runtime only, which does not run the
    session-style replicated programs of this project (TPUEstimator-style: initialize_system, tpu.replicate,
    infeed/outfeed); v2-v4 with the stream-executor runtime do. Unknown types are let through."""
    if not accelerator_type:
        return None
    match = re.match(r"^(v\d+)", accelerator_type.strip().lower())
    if not match or match.group(1) in SUPPORTED_GENERATIONS:
        return None
    return (f"this TPU is a {accelerator_type}: TensorFlow runs on TPU {match.group(1)} only through the PJRT runtime, "
            f"which does not run this project's session-style replicated programs (docs/tpus.md, \"Which TPUs\"): use a TPU VM "
            f"of generation v2, v3 or v4 (e.g. v4-8) with its stream-executor TensorFlow runtime")


# ---------------------------------------------------------------------------------------------------------
# Gathering the facts (bounded in time)


def answers(host: str, port: int, timeout: float) -> bool:
    """Whether host:port accepts a TCP connection within `timeout` seconds, name lookup included (a thread:
    getaddrinfo has no timeout of its own)."""
    result = []

    def connect():
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def _version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def tensorflow_distribution() -> tuple:
    """(the installed TensorFlow distribution's name, its version): tensorflow, tensorflow-tpu, ..."""
    for name in ("tensorflow-tpu", "tensorflow", "tensorflow-cpu", "tf-nightly-tpu", "tf-nightly"):
        version = _version(name)
        if version:
            return name, version
    return "tensorflow", ""


def _tpu_device_files() -> int:
    return len(glob.glob("/dev/accel*")) + len([p for p in glob.glob("/dev/vfio/*") if re.search(r"/\d+$", p)])


def gather_facts(want: Target, timeout: float = DEFAULT_TIMEOUT) -> TpuFacts:
    """This machine's TpuFacts for `want`; only the network facts `want` needs are probed."""
    tensorflow, version = tensorflow_distribution()
    missing = tuple(m for m in RESOLVER_MODULES if importlib.util.find_spec(m) is None)
    address = metadata = None
    if want.kind == "grpc":
        address = answers(*host_port(want.address), timeout)
    elif want.kind == "name" and not missing:
        metadata = answers(os.environ.get("GCE_METADATA_HOST", METADATA_HOST), 80, timeout)
    return TpuFacts(tensorflow=tensorflow, tensorflow_version=version, libtpu=_version("libtpu"),
                    resolver_packages=missing, tpu_device_files=_tpu_device_files(),
                    accelerator_type=os.environ.get("TPU_ACCELERATOR_TYPE") or None,
                    address_answers=address, metadata_answers=metadata)


def check(tpu: str, timeout: float = DEFAULT_TIMEOUT, facts: Optional[TpuFacts] = None) -> tuple:
    """(the Target of --tpu, the TpuFacts), after checking this machine can reach it (a DeviceError naming the fix
    if not)."""
    want = target(tpu, os.environ.get("COLAB_TPU_ADDR"))
    if timeout is None or timeout <= 0:
        raise DeviceError(f"--tpu_timeout must be a positive number of seconds, got {timeout}")
    facts = facts or gather_facts(want, timeout)
    problem = tpu_problem(want, facts, timeout)
    if problem:
        raise DeviceError(problem)
    return want, facts
