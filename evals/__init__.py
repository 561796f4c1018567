"""Evaluation: the validation loss over the eval dataset and the eval tasks (LAMBADA), with their results file."""
import models  # noqa: F401  (installs the mesh-tensorflow compatibility alias first)
