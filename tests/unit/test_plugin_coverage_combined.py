"""What the plugin keeps of the coverage the workers send back (``plugin/coverage.py``): files
named ``tree/REL`` or ``site/REL`` placed where the submitter has them, line runs unpacked, files
it lacks (or names that climb out) left out and counted, a task that measured otherwise than the
rest left out, and a run with pytest-cov whose workers sent nothing said so."""

from __future__ import annotations

from pathlib import Path

from distributed_testing.plugin.coverage import Combined
from distributed_testing.worker.executors.pytest_serve import _runs


def _combined(tmp_path: Path) -> tuple[Combined, Path, Path]:
    tree, site = tmp_path / "tree", tmp_path / "site"
    for f in (tree / "pkg" / "mod.py", site / "dep" / "core.py", tree / "outside.py"):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x = 1\n")
    c = Combined(tree)
    c.sites = [site]
    return c, tree, site


def test_files_are_placed_in_the_submitters_tree_and_site_packages(tmp_path: Path) -> None:
    c, tree, site = _combined(tmp_path)
    c.add("t1", {"coverage": {"arcs": False, "files": {"tree/pkg/mod.py": [[1, 3], [7, 7]],
                                                        "site/dep/core.py": [[2, 2]],
                                                        "tree/pkg/gone.py": [[1, 1]],
                                                        "tree/../outside.py": [[1, 1]],
                                                        "worker/own.py": [[1, 1]]}}})
    c.add("t2", {"coverage": {"arcs": False, "files": {"tree/pkg/mod.py": [[3, 5]]}}})
    assert c.files == {str(tree / "pkg" / "mod.py"): {1, 2, 3, 4, 5, 7}, str(site / "dep" / "core.py"): {2}}
    assert c.unplaced == {"tree/pkg/gone.py", "tree/../outside.py", "worker/own.py"}
    assert c.tasks == 2
    assert any("3 files measured on the workers are not here" in line for line in c.lines(controller=object()))


def test_a_task_that_measured_arcs_among_line_tasks_is_left_out_and_said(tmp_path: Path) -> None:
    c, tree, _ = _combined(tmp_path)
    c.add("t1", {"coverage": {"arcs": True, "files": {"tree/pkg/mod.py": [[-1, 1], [1, -1]]}}})
    c.add("t2", {"coverage": {"arcs": False, "files": {"tree/pkg/mod.py": [[1, 1]]}}})
    c.add("t3", {"coverage": {"error": "coverage failed in the session: RuntimeError: x"}})
    assert c.files == {str(tree / "pkg" / "mod.py"): {(-1, 1), (1, -1)}}
    lines = c.lines(controller=object())
    assert any("task t2: measured lines where the others measured arcs" in line for line in lines)
    assert any("task t3: coverage failed in the session" in line for line in lines)


def test_a_run_whose_workers_sent_no_coverage_says_the_report_is_local(tmp_path: Path) -> None:
    c, _, _ = _combined(tmp_path)
    c.add("t1", {"passed": 3})
    assert any("no coverage came back from the workers" in line for line in c.lines(controller=object()))
    assert c.lines(controller=None) == []  # pytest-cov does not measure this run: nothing to say


def test_line_runs() -> None:
    assert _runs([1, 2, 3, 5, 7, 8]) == [[1, 3], [5, 5], [7, 8]]
    assert _runs([]) == []


def test_a_file_installed_there_is_found_where_this_python_imports_its_package(tmp_path: Path) -> None:
    c, _, _ = _combined(tmp_path)  # its site-packages lack distributed_testing: an import path has it
    c.add("t1", {"coverage": {"arcs": False, "files": {"site/distributed_testing/errors.py": [[1, 2]]}}})
    import distributed_testing.errors as errors

    assert c.files == {str(Path(errors.__file__)): {1, 2}}
