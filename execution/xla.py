"""XLA element-wise fusion (`--xla`; see docs/speed.md).

TensorFlow's auto-clustering compiles the runs of element-wise ops between matmuls
(layer norm, GELU, softmax, bias and residual adds, the optimizer's update) into fused XLA kernels, while the
matmuls/einsums stay TensorFlow's own (oneDNN on CPU) kernels (`--tf_xla_ops_to_cluster=FUSIBLE`). On the
benchmark model this takes most of the memory-bound passes off a step. It costs a one-off compilation when
the first step runs, and values differ from unfused ones by rounding only.
"""
from __future__ import annotations

import os

XLA_FUSION_FLAGS = "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit --tf_xla_ops_to_cluster=FUSIBLE"


def enable_xla_fusion() -> None:
    """Turns XLA auto-clustering of element-wise ops on for this process. TensorFlow reads these flags when it
    creates its first session, so call this before anything runs (importing TensorFlow first is fine)."""
    flags = os.environ.get("TF_XLA_FLAGS", "")
    if "--tf_xla_auto_jit" not in flags:
        os.environ["TF_XLA_FLAGS"] = f"{flags} {XLA_FUSION_FLAGS}".strip()
