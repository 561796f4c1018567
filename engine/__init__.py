"""Running models: the runner (train, eval, predict), checkpoints, devices and meshes, TPUs, optimizer, FLOPs."""
import models  # noqa: F401  (installs the mesh-tensorflow compatibility alias first)
