"""The command line's own pieces: reading configs (with the checks against the registries that define names) and
main.py's flag groups, each declared and handled in one module (training, --predict/--export, planning and
multi-host, GPUs), which turn flags into the jobs' typed options. main.py and tools/ import these; nothing
below them does."""
