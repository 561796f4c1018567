"""evals/task_index.py: lm-eval's index of its own tasks kept on disk. A small stand-in folder plays lm-eval's own
tasks here (the real index takes 5.6 CPU s to build); tests/evals/test_harness.py's unknown task name runs the
real one through it."""
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")
from lm_eval.tasks._index import TaskIndex  # noqa: E402

from evals import task_index  # noqa: E402


def write_task(folder: Path, name: str, tag: str = "tiny") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(f"task: {name}\ntag: {tag}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                    f"    test: {name}.jsonl\noutput_type: loglikelihood\ntest_split: test\n"
                    f"doc_to_text: '{{{{text}}}}'\ndoc_to_target: '{{{{target}}}}'\n")
    return path


def summary(index: dict) -> dict:
    return {name: (entry.kind, entry.yaml_path, sorted(entry.tags)) for name, entry in index.items()}


def test_the_index_is_kept_read_back_and_rebuilt_when_a_task_file_changes(tmp_path, monkeypatch):
    """The first call builds and keeps the index; the second reads it without building; a changed task file
    makes another key, so the index is built again. Bug caught: a key without the files' newest change (an edited
    task read from the old index)."""
    defaults, folder = tmp_path / "defaults", str(tmp_path / "cache")
    write_task(defaults, "alpha")
    edited = write_task(defaults / "more", "beta")
    builds = []

    def build(roots):
        builds.append(roots)
        return TaskIndex.build(roots)

    first = task_index.folder_index(defaults, folder, build)
    assert summary(first) == summary(TaskIndex.build([defaults])) and len(builds) == 1
    assert [name for name in os.listdir(folder) if name.endswith(".pickle")] != []
    assert summary(task_index.folder_index(defaults, folder, build)) == summary(first) and len(builds) == 1
    time.sleep(0.01)
    edited.write_text(edited.read_text().replace("task: beta", "task: gamma"))
    changed = task_index.folder_index(defaults, folder, build)
    assert len(builds) == 2 and "gamma" in changed and "beta" not in changed


def test_a_cache_that_cannot_be_read_or_written_leaves_the_index_as_built(tmp_path):
    """A damaged file is built again (and replaced); a folder that cannot be made (a file in its place) gives the
    index without keeping it; "off" keeps none."""
    defaults = tmp_path / "defaults"
    write_task(defaults, "alpha")
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / f"tasks-{task_index.cache_key(defaults)}.pickle").write_bytes(b"not a pickle")
    assert "alpha" in task_index.folder_index(defaults, str(folder), TaskIndex.build)
    assert "alpha" in task_index.folder_index(defaults, str(folder), lambda roots: pytest.fail("built again"))
    (tmp_path / "file").write_text("")
    assert "alpha" in task_index.folder_index(defaults, str(tmp_path / "file" / "cache"), TaskIndex.build)
    assert task_index.cache_folder({"GPT_NEO_TASK_INDEX_CACHE": "off"}) is None
    assert task_index.cache_folder({"XDG_CACHE_HOME": "/x"}) == "/x/gpt-neo/lm-eval-index"


def test_lm_evals_own_tasks_come_from_the_cache_and_a_later_folder_overrides_them(tmp_path):
    """Inside the context, TaskIndex.build over (lm-eval's own folder, the include path) gives what lm-eval's own
    build gives, the include path's task of the same name winning, with lm-eval's own folder read from the cache
    after its first build. Bug caught: the merge in the other order (lm-eval's task over the user's)."""
    defaults, include, folder = tmp_path / "defaults", tmp_path / "include", str(tmp_path / "cache")
    write_task(defaults, "alpha")
    write_task(defaults, "shared", tag="theirs")
    write_task(include, "shared", tag="ours")
    expected = summary(TaskIndex.build([defaults, include]))
    assert expected["shared"][1] == include / "shared.yaml"
    with task_index.lm_evals_own_tasks_cached(folder, defaults_root=defaults):
        assert summary(TaskIndex().build([defaults, include])) == expected
        assert summary(TaskIndex().build([defaults, include])) == expected  # the second from the cache
    assert len([n for n in os.listdir(folder) if n.endswith(".pickle")]) == 1
    assert summary(TaskIndex.build([defaults, include])) == expected  # lm-eval's own build back after it
