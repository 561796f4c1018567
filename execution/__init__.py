"""How a job's step runs: its mesh-tensorflow graph built on a placement's mesh and lowered (meshes.py), the
program and its steps (runner.py), the session that restores and saves checkpoints (mesh_session.py), where the
first step's ops ran (op_listing.py), stopping on a signal (preemption.py) and `--xla` (xla.py)."""
# No import here: callbacks.py and preemption.py load without TensorFlow (a forked worker, the tests' processes);
# the modules that import mesh_tensorflow import `models` first (its compatibility alias).
