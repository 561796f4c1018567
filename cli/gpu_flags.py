"""main.py's device flags (--gpu_memory, --plain_kernels, --tpu_timeout) and the GPU start-up step that uses them
(runtime/gpus.py)."""
from __future__ import annotations

import os

from runtime.tpu_access import DEFAULT_TIMEOUT as DEFAULT_TPU_TIMEOUT


def add_arguments(p) -> None:
    """The GPU flags, added to main.py's parser (--gpu_ids itself is main.py's)."""
    p.add_argument("--gpu_memory", default="growth", metavar="growth|FRACTION",
                   help="GPU memory for TensorFlow on the --gpu_ids GPUs: 'growth' allocates as needed (default), a "
                        "fraction such as 0.9 reserves that share of each GPU's memory up front")
    p.add_argument("--plain_kernels", action="store_true",
                   help="run the fused kernels (GELU, LayerNorm, softmax gradient, cross-entropy, Adam) as plain "
                        "TensorFlow ops, not XLA-compiled (chosen automatically where XLA:GPU cannot compile; the "
                        "environment variable GPT_NEO_PLAIN_KERNELS=1 does the same)")
    p.add_argument("--tpu_timeout", type=float, default=DEFAULT_TPU_TIMEOUT, metavar="SECONDS",
                   help=f"with --tpu: how long a TPU Node's address (or the metadata server that looks up a TPU "
                        f"name) may take to answer, and the TPU system to initialise (default {DEFAULT_TPU_TIMEOUT:g})")


def apply_plain_kernels(args) -> None:
    """--plain_kernels: before any graph is built (and for the processes this one starts)."""
    if getattr(args, "plain_kernels", False):
        from models.kernels.common import PLAIN_KERNELS_ENV
        os.environ[PLAIN_KERNELS_ENV] = "1"


def start_up(args, placement) -> None:
    """On GPUs: the start-up line (GPUs, compute capability, memory), the XLA:GPU check and the fused kernels'
    path; nothing on CPU devices or a TPU."""
    from runtime import gpus
    from runtime.mesh_session import session_config
    if gpus.uses_gpus(placement):
        gpus.start_up(placement, session_config(placement), xla_autoclustering=bool(getattr(args, "xla", False)))
