"""bench/bench_startup.py's timed run: the first result line's time and the lines before it."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))


def test_startup_bench_times_the_first_result_line_and_the_lines_before_it():
    """bench_startup's timed_run: the first line matching the job's pattern is the first result; lines before it
    are kept, with the longest silence among them."""
    import bench_startup
    code = "import time; print('loading ...'); time.sleep(0.3); print('======== sample 0'); print('after')"
    r = bench_startup.timed_run([sys.executable, "-c", code], bench_startup.FIRST_RESULT["predict"])
    assert r["returncode"] == 0 and r["first_s"] >= 0.3 and r["first_cpu_s"] is not None
    assert [line for _, line in r["lines_before"]] == ["loading ..."]
    assert r["longest_silence_s"] >= 0.3


def test_each_checkpoint_is_exported_to_a_folder_of_its_own(tmp_path):
    """Without --hf_dir the HF side loads an export named after the checkpoint (its path, its index file's time and
    size): another model's or a retrained checkpoint gets a new export, the same checkpoint reuses its own. Bug
    caught (seen: one fixed folder for every run): HF timed on an older checkpoint's export."""
    import bench_startup
    first, second = str(tmp_path / "a" / "model.ckpt-1"), str(tmp_path / "b" / "model.ckpt-1")
    for prefix in (first, second):
        os.makedirs(os.path.dirname(prefix))
        with open(prefix + ".index", "w") as f:
            f.write("index")
    folder = bench_startup.export_folder(first)
    assert folder == bench_startup.export_folder(first) != bench_startup.export_folder(second)
    with open(first + ".index", "w") as f:
        f.write("a longer index")  # retrained in place
    assert bench_startup.export_folder(first) != folder
