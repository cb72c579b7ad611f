"""Every notebook executes top to bottom (nbclient); a failing cell fails the suite.

Each runs in a copy under a temporary directory (its figures and runs land there, not in the repository);
notebook 02 trains for TJ_NOTEBOOK_STEPS updates instead of its default, to fit the suite's time budget.
"""

import os
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs(notebook, tmp_path, monkeypatch):
    if "torch" in notebook.stem:
        pytest.importorskip("torch")
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
    assert os.listdir(tmp_path)  # it ran where we put it
