"""Running models: devices and meshes, optimizer, FLOPs, and the TPUEstimator glue."""
import models  # noqa: F401  (installs the mesh-tensorflow compatibility alias first)
