"""Inference: the PREDICT outputs (sampling, scoring, logits), running them over rows of prompts from a
checkpoint, --predict's prompt files and outputs, and the SavedModel export."""
import models  # noqa: F401  (installs the mesh-tensorflow compatibility alias first)
