"""The lab's notebook (jobs/notebooks/) runs top to bottom on a Jupyter kernel against a real Spark master.

nbclient, Jupyter's own executor, runs every cell of ``train_on_cluster.ipynb`` in a fresh ``python3`` kernel
(this venv's interpreter, through ipykernel) with the environment the lab gives Jupyter: ``SPARK_MASTER_URL``
(here ``drivers_cluster``'s master), ``TRAINER_WORKERS`` (2) and ``MLFLOW_TRACKING_URI`` (a SQLite store in a
temporary folder instead of the lab's MLflow server), and its parameters cell (tagged ``parameters``, as
papermill does) set to ``EPOCHS = 3``: the data is scikit-learn's digits (1,797 rows), so what the test waits for
is the kernel, the session and the executors' Python workers, not the training. A cell that raises fails the test
with its traceback; the notebook asserts itself that the model MLflow logged predicts as the Pipeline's, and the
test reads the accuracy the first fit printed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "jobs" / "notebooks" / "train_on_cluster.ipynb"
EPOCHS = 3
LEARNED = 0.8  # digits, 3 epochs of Adam at 1e-3 on 2 workers: chance is 0.1


def printed(cell) -> str:
    """What a cell printed on stdout (the progress bars go to stderr)."""
    return "".join(output.get("text", "") for output in cell.get("outputs", [])
                   if output.get("output_type") == "stream" and output.get("name") == "stdout")


def with_parameters(notebook, **values):
    """The notebook with its ``parameters`` cell's assignments ``NAME = ...`` set to `values` (papermill's way)."""
    (cell,) = [c for c in notebook.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    for name, value in values.items():
        cell.source, count = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", cell.source, flags=re.MULTILINE)
        assert count == 1, f"the parameters cell has no line `{name} = ...`"
    return notebook


@pytest.mark.timeout(600)
@pytest.mark.in_the_lab_too  # tests/lab/test_lab_containers.py runs the same notebook in the lab's Jupyter
def test_the_lab_notebook_runs_on_a_cluster(drivers_cluster, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("SPARK_MASTER_URL", drivers_cluster.master_url)
    monkeypatch.setenv("TRAINER_WORKERS", "2")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    notebook = with_parameters(nbformat.read(NOTEBOOK, as_version=4), EPOCHS=EPOCHS)
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()  # raises CellExecutionError, with the cell and its traceback, when a cell fails
    finally:
        nbformat.write(notebook, tmp_path / "executed.ipynb")  # every cell's output, for a look after a failure

    texts = [printed(cell) for cell in notebook.cells if cell.cell_type == "code"]
    assert any("with 2 workers" in text for text in texts), texts[0]
    (evaluated,) = [printed(cell) for cell in notebook.cells if "print(fitted.evaluate(df))" in cell.source]
    accuracies = [float(value) for value in re.findall(r"'accuracy': (?:np\.float\d+\()?([\d.]+)", evaluated)]
    assert accuracies and min(accuracies) >= LEARNED, f"the notebook's fit did not learn: {evaluated!r}"
    (pipeline,) = [float(m.group(1)) for text in texts for m in [re.search(r"pipeline accuracy: ([\d.]+)", text)] if m]
    assert pipeline >= LEARNED, f"the Pipeline's model did not learn: {pipeline}"
    assert any("predicts as the Pipeline's KerasModel" in text for text in texts), texts[-2:]


def test_the_notebook_uses_the_public_api_and_the_lab_s_worker_count():
    """The notebook teaches what the docs advise: the public API, the default algorithm, the lab's TRAINER_WORKERS."""
    source = NOTEBOOK.read_text(encoding="utf-8")
    assert "TRAINER_WORKERS" in source, "the notebook must follow the lab's worker count (compose and k8s set it)"
    for internal in ("trainer.spark", "trainer.runtime", "trainer.fit", "wait_for_executors", "NUM_WORKERS"):
        assert internal not in source, f"the notebook uses {internal!r}: use the public API (trainer, trainer.ml)"
    assert "algorithm=" not in source, \
        "the notebook trains with the default algorithm (docs/guide.md#choosing-an-algorithm)"
