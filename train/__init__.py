"""Training: the objective over micro-batches, the optimizer, the training step lowered on a mesh, the loop
that runs it (on CPUs, GPUs and TPUs, with checkpoints and Ctrl-C) and its progress lines."""
import models  # noqa: F401  (installs the mesh-tensorflow compatibility alias first)
