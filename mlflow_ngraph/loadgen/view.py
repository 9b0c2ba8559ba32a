"""The MLflow view of a loadgen invocation: a shared view of the experiment (the tag
``mlflow.sharedViewState.<KEY>``, as ``benchmark``'s, :mod:`mlflow_ngraph.tracking.ui`)
holding the device's loadgen runs with the scenarios' columns: who (model, compiler, engine
or served), then per scenario its figure and LoadGen's verdict, Server's bound beside it."""

from __future__ import annotations

import re
from collections.abc import Sequence

from mlflow_ngraph.loadgen.record import validity_tag
from mlflow_ngraph.tracking import schema as S

#: each scenario's columns: (kind, key) as the runs table names them
FIGURE_COLUMNS = {
    "singlestream": [("metrics", "singlestream.p90_ms")],
    "multistream": [("metrics", "multistream.p99_ms")],
    "offline": [("metrics", "offline.samples_per_s")],
    "server": [
        ("metrics", "server.qps"),
        ("metrics", "server.p99_ms"),
        ("params", "loadgen.latency_bound_ms"),
    ],  # fmt: skip
}


def column(kind: str, key: str) -> str:
    return f"{kind}.`{key}`"


def view_key(device: str) -> str:
    """``ngraph-loadgen-cpu``: the share key of a device's loadgen view."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", device).strip("-") or "device"
    return f"ngraph-loadgen-{slug}"


def columns(scenarios: Sequence[str]) -> list[str]:
    """Model, compiler, engine or served; per scenario its figures and its verdict."""
    out = [column("params", S.P_MODEL), column("params", S.P_COMPILER),
           column("params", "loadgen.driven")]  # fmt: skip
    for scenario in scenarios:
        out += [column(kind, key) for kind, key in FIGURE_COLUMNS[scenario]]
        out.append(column("tags", validity_tag(scenario)))
    return out + [column("params", S.P_DEVICE)]


def view_state(device: str, scenarios: Sequence[str]) -> dict:
    """The view: the device's loadgen runs, sorted by the first scenario's figure."""
    from mlflow_ngraph.tracking.ui import table_state

    selected = columns(scenarios)
    first = FIGURE_COLUMNS[scenarios[0]][0]
    literal = device.replace("'", "\\'")
    return {
        "searchFilter": f"params.{S.P_DEVICE} = '{literal}' and tags.`{S.T_ROLE}` = 'loadgen'",
        "orderByKey": column(*first),
        "orderByAsc": first[1].endswith("_ms"),  # a latency: lowest first
        **table_state(selected),
        "runsHiddenMode": "SHOW_ALL",
        "compareRunCharts": [],
        "hideEmptyCharts": True,
    }


def write_view(client, experiment_id: str, device: str, scenarios: Sequence[str]) -> str:
    """The view written to the experiment, with the columns of ``scenarios`` and of every
    scenario an earlier invocation measured on the device (an invocation of one scenario
    does not hide the others'); returns its key."""
    from mlflow_ngraph.tracking.ui import VIEW_TAG_PREFIX, encode_view

    key = view_key(device)
    shown = measured_scenarios(client, experiment_id, device, scenarios)
    state = view_state(device, shown)
    name = f"mlflow-ngraph loadgen: {device}, {', '.join(shown)}"
    client.set_experiment_tag(experiment_id, VIEW_TAG_PREFIX + key, encode_view(name, state))
    return key


def measured_scenarios(
    client, experiment_id: str, device: str, scenarios: Sequence[str]
) -> list[str]:
    """``scenarios`` and those the device's loadgen runs in the experiment carry a verdict
    of, in the order of :data:`FIGURE_COLUMNS`."""
    from mlflow.entities import ViewType

    literal = device.replace("'", "\\'")
    found = set(scenarios)
    runs = client.search_runs(
        [experiment_id],
        f"params.{S.P_DEVICE} = '{literal}' and tags.`{S.T_ROLE}` = 'loadgen'",
        run_view_type=ViewType.ACTIVE_ONLY,
        max_results=1000,
    )
    for run in runs:
        found |= {s for s in FIGURE_COLUMNS if validity_tag(s) in run.data.tags}
    return [s for s in FIGURE_COLUMNS if s in found]
