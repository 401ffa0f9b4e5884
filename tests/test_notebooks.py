"""The colab/ notebooks run top to bottom in FAST mode (nbclient, a fresh kernel); any cell that raises
fails the test. No outputs are committed with them."""
from __future__ import annotations

import glob
import os

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "colab", "*.ipynb")))


def test_notebooks_are_committed_without_outputs():
    assert len(NOTEBOOKS) >= 2
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code"), path


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_top_to_bottom_in_fast_mode(path, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSPEC_FAST", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors


@pytest.mark.slow
def test_the_install_cell_makes_jaxspec_train_importable_in_the_same_kernel(tmp_path):
    """A fresh kernel as on Colab: jaxspec's dependencies are there, jaxspec is not. The notebooks'
    first cell clones the repository, installs it (editable), and the same process then imports
    jaxspec.train, whose folder (train/) only the install's import hook maps."""
    import site
    import subprocess
    import sys
    venv, preinstalled = tmp_path / "venv", tmp_path / "preinstalled"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    preinstalled.mkdir()
    for name in os.listdir(site.getsitepackages()[0]):       # this environment's packages, jaxspec's own left out
        if "jaxspec" not in name and not name.endswith(".pth"):
            os.symlink(os.path.join(site.getsitepackages()[0], name), preinstalled / name)
    python = str(venv / "bin" / "python")
    packages = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                              capture_output=True, text=True).stdout.strip()
    with open(os.path.join(packages, "preinstalled.pth"), "w") as f:
        f.write(str(preinstalled) + "\n")
    cell = "".join(nbformat.read(NOTEBOOKS[1], as_version=4).cells[1].source)
    script = cell + "\nimport jaxspec.train, jaxspec.train.data\nprint('imported', jaxspec.train.__name__)\n"
    done = subprocess.run([python, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "JAXSPEC_REPO": ROOT, "PYTHONPATH": ""})
    assert done.returncode == 0 and "imported jaxspec.train" in done.stdout, done.stderr[-3000:]
