"""modelpath/run_info.py: model_path/run_info.json keeps every start of a run, and a damaged one never blocks
training."""
from modelpath import run_info


def test_run_info_keeps_every_start_and_survives_a_damaged_file(tmp_path, capsys):
    """Two starts (the second a resume with its own train_steps and lr) are both listed; a file cut short reads as
    None with a warning and the next start keeps it as run_info.json.damaged. (Bugs: the earlier starts dropped,
    `starts = []`; the damaged file overwritten, its rename to .damaged left out.)"""
    path = str(tmp_path)
    run_info.write(path, {"n_layer": 2, "train_steps": 10, "lr": 0.1}, start_step=0, sacred_id="7")
    run_info.write(path, {"n_layer": 2, "train_steps": 20, "lr": 0.05}, start_step=10)
    info = run_info.read(path)
    assert info["train_steps"] == 20 and [s["step"] for s in info["starts"]] == [0, 10]
    assert info["starts"][0]["sacred_id"] == "7" and info["starts"][1]["lr"] == 0.05
    (tmp_path / "run_info.json").write_text('{"cut short')
    assert run_info.read(path) is None and "damaged" in capsys.readouterr().err
    run_info.write(path, {"n_layer": 2}, start_step=20)  # a new one, the damaged one kept aside
    assert (tmp_path / "run_info.json.damaged").exists() and len(run_info.read(path)["starts"]) == 1
