"""The ladder's worker: one process that trains (or evaluates) every run of a `python -m ladder run` in turn, as
`main.py` would in a process of its own, so that TensorFlow is imported once per ladder, not once per run
(~8 CPU s each on a 2-core EPYC), and the peak measurement (devices/peaks.py) is made once.

    python -m ladder.worker TOKEN CPU_DEVICES      (started by ladder/run.py's `Worker`, in the repository)

It reads one run a line on stdin, a JSON list: main.py's arguments (`["--model", "out/configs/NAME.json"]`), runs
`main.main` on them with `sys.argv` as main.py's would be, and after the run's own output (stdout and stderr, as
main.py prints them) writes the line `TOKEN CODE`, CODE being main.py's exit code. It ends at the end of stdin.

Nothing of a run outlives it that another run would see: each program builds its own tf.Graph and session; the
training lock (modelpath/lock.py), the event writers (train/trackers.py), the signal handlers (execution/
preemption.py) and the kernels' path (models/kernels/common.py) are held by `with` blocks or callbacks that end
with the run; what is kept is what holds for every run of the process: the peak measured on a device in a dtype,
the data files' record counts, the tokenizer files read, the console's stderr filter. The CPU is split into
CPU_DEVICES logical devices before TensorFlow starts, the most any run's mesh uses (TensorFlow cannot split it
again later; a run on fewer uses the first ones).

SIGINT and SIGTERM reach the run as they reach main.py: the training loop saves after its step and main.main
returns 130 or 143 (execution/preemption.py). Between runs SIGINT ends the worker quietly (the ladder passes
signals on only while a run is under way).
"""
from __future__ import annotations

import json
import sys
import traceback


def system_exit_code(e: SystemExit) -> int:
    """The exit code a `sys.exit(e.code)` would give the process (argparse's errors exit 2, a message exits 1,
    printed to stderr as the interpreter would); tests/workspace.run_main_in_process takes it too."""
    if e.code is None or isinstance(e.code, int):
        return e.code or 0
    print(e.code, file=sys.stderr)
    return 1


def run_one(main_module, argv: list) -> int:
    """main.py's exit code for `argv`, run here: what escapes main.main is reported as main.py would be."""
    sys.argv = ["main.py", *argv]  # the training lock and anything reading the command line see this run's
    try:
        return main_module.main(argv)
    except SystemExit as e:
        return system_exit_code(e)
    except KeyboardInterrupt:  # a second Ctrl-C, or one where main.main does not catch it
        print("interrupted; the last checkpoint is intact", file=sys.stderr)
        return 130
    except Exception:  # main.py would die with its traceback: shown, and the ladder stops on the code
        traceback.print_exc()
        return 1


def serve(token: str, cpu_devices: int) -> int:
    import main as main_module  # the repository's main.py (the worker runs in the repository, as main.py does)
    if cpu_devices > 1:
        from devices.placement import cpu_devices as names, local_placement
        local_placement(names(cpu_devices))  # before TensorFlow starts: the largest mesh's split, once
    while True:
        line = sys.stdin.readline()
        if not line:
            return 0
        code = run_one(main_module, json.loads(line))
        sys.stderr.flush()
        print(f"{token} {code}", flush=True)


def main(argv=None) -> int:
    token, cpu_devices = (argv if argv is not None else sys.argv[1:])
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()  # before TensorFlow is imported, as main.py does
    try:
        return serve(token, int(cpu_devices))
    except KeyboardInterrupt:  # between runs: nothing under way to save
        return 130


if __name__ == "__main__":
    sys.exit(main())
