"""Every notebook executes top to bottom (nbclient); a failing cell fails the suite.

Each runs in a copy under a temporary directory (its figures and runs land there, not in the repository);
notebook 02 trains for TJ_NOTEBOOK_STEPS updates instead of its default, to fit the suite's time budget. They run on
the newest stack only (`newest_stack`): what they call is tested on both, and they cost CI about a minute and a half.
"""

import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

# What each notebook writes, relative to where it runs.
OUTPUTS = {"01_model_walkthrough": "figures", "02_train_and_translate": "runs/notebook_tiny"}
NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))


@pytest.mark.newest_stack
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs(notebook, tmp_path, monkeypatch):
    if "torch" in notebook.stem:
        pytest.importorskip("torch")
    repository_files = sorted(NOTEBOOK_DIR.rglob("*"))
    copy = tmp_path / notebook.name
    shutil.copy(notebook, copy)
    monkeypatch.setenv("TJ_NOTEBOOK_STEPS", "40")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    document = nbformat.read(copy, as_version=4)
    NotebookClient(
        document, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    errors = [
        output
        for cell in document.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert not errors
    if notebook.stem in OUTPUTS:
        assert any((tmp_path / OUTPUTS[notebook.stem]).iterdir()), "the notebook wrote nothing where it ran"
    assert sorted(NOTEBOOK_DIR.rglob("*")) == repository_files, "the notebook wrote into the repository"
