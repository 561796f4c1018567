"""modelpath/events.py: a model_path's TensorBoard scalars, written with TensorFlow's writer and read back from the
event files themselves (no TensorFlow, no TensorBoard)."""
import os

from modelpath import events


def write_run(folder, steps: dict, name: str) -> str:
    """One writer's event file of {step: loss}, renamed to `name` (its creation time is in the name)."""
    before = set(os.listdir(folder)) if os.path.isdir(folder) else set()
    writer = events.summary_writer(folder)
    for step, loss in steps.items():
        events.write_scalars(writer, step, {"loss": loss, "lr": 1e-3 * step})
    writer.close()
    (written,) = set(os.listdir(folder)) - before
    os.rename(os.path.join(folder, written), os.path.join(folder, name))
    return os.path.join(folder, name)


def test_a_step_written_again_after_a_restart_reads_as_its_later_value(tmp_path):
    """Two event files in one model_path: a run to step 3, then one restarted from step 1 that wrote steps 2 and 3
    again, its file made at a later time whose digits sort before the first's as text (1000000000 after 999999999),
    and cut short inside the header of a record it was writing. read_scalars gives each step once, sorted, with the
    restart's values, and stops quietly at the torn header. (Bugs: the files read in the order of their names,
    `sorted(glob(...))` without `_event_file_order`, so the first run's values win; a short header only checked
    for being empty, `if not header: return`, so a torn one fails struct.unpack.)"""
    folder = str(tmp_path)
    write_run(folder, {1: 3.0, 2: 2.0, 3: 1.0}, "events.out.tfevents.999999999.host")
    restarted = write_run(folder, {2: 2.5, 3: 1.5}, "events.out.tfevents.1000000000.host")
    with open(restarted, "ab") as f:
        f.write(b"\x20\x00\x00\x00\x00")  # 5 of a record header's 12 bytes: a writer still writing
    scalars = events.read_scalars(folder)
    assert scalars["loss"] == [(1, 3.0), (2, 2.5), (3, 1.5)]
    assert [step for step, _ in scalars["lr"]] == [1, 2, 3]
    assert events.read_scalars(events.folder(folder, evaluation=True)) == {}  # no eval/ folder: nothing, no error
