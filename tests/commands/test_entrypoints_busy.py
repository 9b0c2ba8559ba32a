"""The MLproject's benchmark and blocks entry points pass the busy-host options through:
``-P busy_ok=true`` becomes the flag, ``-P wait_quiet=S`` the seconds, an unset one nothing."""

from __future__ import annotations

import pytest

from mlflow_ngraph.commands.entrypoints import command_line
from tests._support import REPO


@pytest.mark.parametrize("entry", ["benchmark", "blocks"])
def test_the_entry_points_pass_the_busy_host_options(entry):
    from mlflow.projects.utils import load_project

    from mlflow_ngraph.cluster.backend import entry_command

    project = load_project(str(REPO))
    args = entry_command(project, entry, {"busy_ok": "true", "wait_quiet": "600"})
    assert args[0] == entry and "--busy-ok" in args
    assert args[args.index("--wait-quiet") + 1] == "600"
    unset = entry_command(project, entry, {})
    assert "--busy-ok" not in unset and "--wait-quiet" not in unset
    assert command_line(entry, ["--busy-ok", "false", "--wait-quiet", "0"]) == [
        entry, "--wait-quiet", "0"
    ]  # fmt: skip
