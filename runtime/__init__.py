"""Where models run: devices and meshes, multi-host clusters, TPUs, sessions that restore and save
checkpoints, and the lowering of a mode's mesh-tensorflow graph. The jobs (train/, infer/, evals/, plan/)
build on these; nothing here knows what a job does."""
import models  # noqa: F401  (installs the mesh-tensorflow compatibility alias first)
