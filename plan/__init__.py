"""Planning before training: the model graph built without devices, --dry_run's counts, memory and smallest
mesh, and --auto_layout's search with mesh-tensorflow's auto_mtf."""
import models  # noqa: F401  (installs the mesh-tensorflow compatibility alias first)
