"""The command line's own pieces: main.py's flag groups, each declared and handled in one module (training,
--predict/--export, --eval's harness, planning and multi-host, GPUs), which turn flags into the jobs' typed
options. main.py imports these; nothing below it does. (Reading configs and their checks are
config.py's, below the jobs.)"""
