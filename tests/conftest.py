import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("PYTHONHASHSEED", "0")


@pytest.fixture(scope="session", autouse=True)
def offline_trackers(tmp_path_factory):
    """No test reaches a tracking server or leaves a tracker's folder in the working directory: W&B runs offline
    with its folder here, MLflow's default store is a local file store here (a test that opens a run names its own
    folder in its own ``tmp_path``; this is the net under it). Subprocesses inherit the same environment."""
    folder = tmp_path_factory.mktemp("trackers")
    mp = pytest.MonkeyPatch()
    for key, value in (
        ("WANDB_MODE", "offline"),
        ("WANDB_SILENT", "true"),
        ("WANDB_DIR", str(folder)),
        ("WANDB_DISABLE_GIT", "true"),
        ("MLFLOW_ALLOW_FILE_STORE", "true"),
        ("MLFLOW_TRACKING_URI", f"file:{folder / 'mlruns'}"),
    ):
        mp.setenv(key, value)
    yield folder
    mp.undo()


@pytest.fixture
def trackers(tmp_path):
    """This test's own W&B (offline, folder ``tmp_path``) and MLflow (file store ``tmp_path/mlruns``), free of what
    an earlier test left in either's process-wide state (``trackers.own_trackers``)."""
    from trackers import own_trackers

    with own_trackers(tmp_path) as folder:
        yield folder
