"""How a job's step runs: its mesh-tensorflow graph built on a placement's mesh and lowered (meshes.py), the
program and its steps (runner.py), the session that restores and saves checkpoints (mesh_session.py), where the
first step's ops ran (op_listing.py), stopping on a signal (preemption.py) and `--xla` (xla.py)."""
import models  # noqa: F401  (installs the mesh-tensorflow compatibility alias before mesh_tensorflow is imported)
