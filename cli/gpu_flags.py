"""main.py's device flags (--gpu_memory, --plain_kernels, --tpu_timeout) and the start-up step that settles the
placement with them (the placement's start_up: runtime/gpus.py on GPUs)."""
from __future__ import annotations

import argparse
import os
import tempfile

from console import number_above
from runtime.tpu_access import DEFAULT_TIMEOUT as DEFAULT_TPU_TIMEOUT

PLAIN_KERNELS_ENV = "GPT_NEO_PLAIN_KERNELS"  # the environment's way to say --plain_kernels (read here only)


def add_arguments(p) -> None:
    """The device flags, added to main.py's parser (--gpu_ids and --tpu themselves are main.py's)."""
    p.add_argument("--gpu_memory", default="growth", metavar="growth|FRACTION", type=gpu_memory,
                   help="GPU memory for TensorFlow on the --gpu_ids GPUs: 'growth' allocates as needed (default), a "
                        "fraction such as 0.9 reserves that share of each GPU's memory up front")
    p.add_argument("--plain_kernels", action="store_true",
                   help="run the fused kernels (GELU, LayerNorm, softmax gradient, cross-entropy, Adam) as plain "
                        "TensorFlow ops, not XLA-compiled (chosen automatically where XLA:GPU cannot compile; the "
                        f"environment variable {PLAIN_KERNELS_ENV}=1 does the same)")
    p.add_argument("--selfcheck", nargs="?", const="float32", choices=("float32", "bfloat16", "float16"),
                   help="check the devices (--gpu_ids, --tpu; default the CPU): a tiny model trains a few steps there "
                        "and on the CPU in this dtype (default float32), compared step by step; prints a verdict "
                        "line and a JSON report (the first command to run on new hardware)")
    p.add_argument("--tpu_timeout", type=number_above(0), default=DEFAULT_TPU_TIMEOUT, metavar="SECONDS",
                   help=f"with --tpu: how long a TPU Node's address (or the metadata server that looks up a TPU "
                        f"name) may take to answer, and the TPU system to initialise (default {DEFAULT_TPU_TIMEOUT:g})")


def gpu_memory(text: str) -> str:
    """--gpu_memory's argparse type: 'growth' or a fraction in (0, 1] (runtime/gpus.py reads it), checked when the
    command line is read, also on a machine without GPUs, where it would otherwise never be looked at."""
    from runtime.errors import DeviceError
    from runtime.gpus import parse_gpu_memory
    try:
        parse_gpu_memory(text)
    except DeviceError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--gpu_memory ")) from None
    return text


def kernels(args, environ=os.environ) -> str:
    """The fused kernels' path asked for: "plain" with --plain_kernels or GPT_NEO_PLAIN_KERNELS=1, else "xla"."""
    forced = environ.get(PLAIN_KERNELS_ENV, "").strip().lower() not in ("", "0", "false", "no")
    return "plain" if getattr(args, "plain_kernels", False) or forced else "xla"


def start_up(args, placement, precision: str = "float32"):
    """The placement started up with the kernels' path and --xla asked for (its start_up: on GPUs the start-up
    line and the XLA:GPU check, runtime/gpus.py)."""
    return placement.start_up(kernels(args) == "plain", bool(getattr(args, "xla", False)), precision)


def selfcheck(args) -> int:
    """--selfcheck: the placement from the device flags (one CPU device by default), then the check
    (selfcheck/job.py) in a temporary folder."""
    from cli.config_loading import config_from_dict
    from runtime import devices, tpu
    from selfcheck import job
    if args.tpu:
        placement = tpu.placement(args.tpu, args.tpu_timeout)
    else:
        placement = devices.local_placement(args.gpu_ids or ["device:CPU:0"], args.gpu_memory)
    placement = start_up(args, placement, args.selfcheck)
    n_devices = placement.n_devices
    with tempfile.TemporaryDirectory(prefix="gpt-neo-selfcheck-") as root:
        on_devices, on_cpu = job.model_settings(n_devices, args.selfcheck, root)
        return job.run(config_from_dict(on_devices, "the selfcheck model"),
                       config_from_dict(on_cpu, "the selfcheck model"), placement, start_up(args, job.REFERENCE))
