"""Search MLflow for benchmark cell runs and flatten them into a pandas DataFrame.

Filtering happens on the tracking server (MLflow's run search with params and tags in the
filter string, paged with page tokens; see :mod:`.runsource` for how pages are fetched);
per-batch values come from the flat ``<metric>.bs<batch>`` keys already present in each run,
so a query costs one request per page, never one per run or per metric.

The DataFrame has one row per run x batch size. Columns: ``run_id``, ``experiment_id``,
``start_time``, ``parent_run_id``, ``device``, ``model``, ``family``, ``compiler``,
``scenario``, ``model_params`` (``k=v,...``), ``flags`` (``k=v,...``), ``model.<param>`` for
every init param, ``status`` (the ``ngraph.status`` tag), ``error``, ``batch_size`` and one
column per metric name (``throughput``, ``cpu_percent``, ...).
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Collection, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlparse

import pandas as pd
from mlflow.entities import ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.report.runsource import RunData, Searcher, from_record, searcher_for
from mlflow_ngraph.tracking import schema
from mlflow_ngraph.tracking.mlflow_log import redact_uri

log = logging.getLogger(__name__)

IDENTITY = "identity"

#: MLflow's own cap on one page (sqlalchemy and file stores, and the server's REST handler).
MAX_PAGE = 50_000
#: a conservative page for stores of unknown limits (Databricks caps search pages lower).
SAFE_PAGE = 1_000

#: filter attribute -> MLflow param it tests, in the order an empty result is diagnosed.
_PARAM_FILTERS = (
    ("devices", schema.P_DEVICE, "--device"),
    ("families", schema.P_FAMILY, "--family"),
    ("models", schema.P_MODEL, "--model"),
    ("compilers", schema.P_COMPILER, "--compiler"),
)

BASE_COLUMNS = [
    "run_id",
    "experiment_id",
    "start_time",
    "parent_run_id",
    "device",
    "model",
    "family",
    "compiler",
    "scenario",
    "model_params",
    "flags",
    "status",
    "error",
    "batch_size",
    "stability",
]


@dataclass(frozen=True)
class RunQuery:
    """What ``compare`` selects. Empty tuples select everything.

    Attributes:
        experiments: experiment names or ids (all active experiments when empty).
        devices, models, families, compilers: param values to keep.
        sweeps: sweep ids to keep (the ``ngraph.sweep`` tag of the runs a sweep started).
        batch_sizes: batch sizes to show (applied on the client, after the baselines).
        valid_only: keep only runs tagged ``ngraph.status = OK``.
    """

    experiments: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    families: tuple[str, ...] = ()
    compilers: tuple[str, ...] = ()
    sweeps: tuple[str, ...] = ()
    batch_sizes: tuple[int, ...] = ()
    valid_only: bool = False
    where: tuple[tuple[str, str], ...] = ()

    def server_where(self) -> dict[str, list[str]]:
        """``--where`` filters the server applies (params every cell of a model shares)."""
        return _grouped((k, v) for k, v in self.where if not k.startswith(schema.P_FLAG_PREFIX))

    def flag_where(self) -> dict[str, list[str]]:
        """``--where flag.X=...`` filters, applied on the client: the identity has no such
        flag, and it must still be fetched as the baseline."""
        return _grouped((k, v) for k, v in self.where if k.startswith(schema.P_FLAG_PREFIX))


def _grouped(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in pairs:
        out.setdefault(key, []).append(value)
    return out


#: ``--where`` keys beside the dedicated options: the scenario, model init params and flags
WHERE_KEYS = (schema.P_SCENARIO, schema.P_PARAMETER_COUNT)


def parse_where(items: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``["model.width=64", "scenario=latency"]`` -> ``(("model.width", "64"), ...)``.

    Raises:
        NgraphError: an item without ``=``, or a key that is no cell param.
    """
    out = []
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise NgraphError(f"--where {item!r}: expected KEY=VALUE")
        if not _where_key_ok(key):
            known = ", ".join(WHERE_KEYS)
            raise NgraphError(
                f"unknown filter key {key!r} (use --device/--model/--family/--compiler, or "
                f"--where with {known}, model.<init param> or flag.<compiler flag>)"
            )
        out.append((key, value.strip()))
    return tuple(out)


def _where_key_ok(key: str) -> bool:
    if key in WHERE_KEYS:
        return True
    for prefix in (schema.P_MODEL_PARAM_PREFIX, schema.P_FLAG_PREFIX):
        if key.startswith(prefix) and len(key) > len(prefix):
            return True
    return False


def page_size(tracking_uri: str) -> int:
    """The largest page the store behind ``tracking_uri`` accepts."""
    scheme = urlparse(tracking_uri).scheme.split("+", 1)[0].lower() or "file"
    known = {"sqlite", "postgresql", "mysql", "mssql", "file", "http", "https"}
    if tracking_uri.startswith("databricks") or scheme not in known:
        return SAFE_PAGE
    return MAX_PAGE


def resolve_experiments(client: MlflowClient, names_or_ids: Iterable[str]) -> list[str]:
    """Experiment ids for names or ids; all active experiments when none are given.

    Raises:
        NgraphError: an experiment that exists neither as a name nor as an id.
    """
    wanted = list(names_or_ids)
    if not wanted:
        return [e.experiment_id for e in _all_experiments(client)]
    ids = []
    for ref in wanted:
        experiment = client.get_experiment_by_name(ref)
        if experiment is None and ref.isdigit():
            experiment = _experiment_by_id(client, ref)
        if experiment is None:
            raise NgraphError(
                f"no runs match --experiment {ref!r}: no such experiment in "
                f"{redact_uri(str(client.tracking_uri))}; {fill_hint(ref, client)}"
            )
        ids.append(experiment.experiment_id)
    return ids


def fill_hint(name: str, client: MlflowClient | None = None) -> str:
    """The command that fills experiment ``name``: the blocks' grid, a packaged spec's
    benchmark, or (for a name of the user's) the experiments the store holds instead."""
    if name == BLOCKS_EXPERIMENT:
        return (
            "`mlflow-ngraph blocks --small` fills it (minutes on 2 cores; without --small the "
            "paper's grid, hours)"
        )
    packaged = packaged_specs()
    if name in packaged:
        return f"`mlflow-ngraph benchmark --spec {packaged[name]}` fills it"
    if client is not None:
        names = [e.name for e in _all_experiments(client)][:8]
        if names:
            return "experiments there: " + ", ".join(names)
    return f"`mlflow-ngraph benchmark --experiment {name} ...` fills it"


#: the experiment `mlflow-ngraph blocks` fills by default (Tables VII/VIII)
BLOCKS_EXPERIMENT = "ngraph-blocks"


def packaged_specs() -> dict[str, str]:
    """Experiment name -> the packaged spec that fills it (``ngraph-default`` -> ``default``)."""
    from importlib import resources

    import yaml

    out = {}
    for entry in (resources.files("mlflow_ngraph") / "experiments").iterdir():
        if entry.name.endswith(".yaml") and not entry.name.startswith("sweep"):
            data = yaml.safe_load(entry.read_text()) or {}
            if data.get("experiment"):
                out[data["experiment"]] = entry.name.removesuffix(".yaml")
    return out


def _experiment_by_id(client: MlflowClient, experiment_id: str):
    try:
        return client.get_experiment(experiment_id)
    except MlflowException:
        return None


def _all_experiments(client: MlflowClient) -> Iterator:
    token = None
    while True:
        page = client.search_experiments(
            ViewType.ACTIVE_ONLY, max_results=SAFE_PAGE, page_token=token
        )
        yield from page
        token = page.token
        if not token:
            return


def _quote(value: str) -> str:
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise NgraphError(f"filter value {value!r} holds both quote characters")


def filter_strings(query: RunQuery) -> list[str]:
    """Server-side filter strings whose results, together, are the runs ``query`` needs.

    MLflow's filter grammar has neither ``OR`` nor ``IN`` for params, so a filter with several
    values becomes one search per combination of values. The identity is always fetched with
    the compilers asked for: it is the baseline of every relative metric.
    """
    clauses = [f"tags.\"{schema.T_ROLE}\" = 'cell'"]
    if query.valid_only:
        clauses.append(f"tags.\"{schema.T_STATUS}\" = '{schema.STATUS_OK}'")
    choices = [[f'tags."{schema.T_SWEEP}" = {_quote(v)}' for v in sorted(set(query.sweeps))]]
    choices[0] = choices[0] or [None]
    for attr, param, _ in _PARAM_FILTERS:
        values = sorted(set(getattr(query, attr)))
        if attr == "compilers" and values:
            values = sorted(set(values) | {IDENTITY})
        choices.append([f"params.{param} = {_quote(v)}" for v in values] or [None])
    for key, values in sorted(query.server_where().items()):
        choices.append([f"params.`{key}` = {_quote(v)}" for v in sorted(set(values))])
    out = []
    for combo in itertools.product(*choices):
        out.append(" and ".join(clauses + [c for c in combo if c]))
    return out


@functools.lru_cache(maxsize=65536)
def _parsed(key: str) -> tuple[str, int] | None:
    """``schema.parse_flat_key``, memoized: every run repeats the same few hundred keys."""
    return schema.parse_flat_key(key)


def run_records(run: RunData, metrics: Collection[str] | None = None) -> list[dict]:
    """One record per batch size of ``run`` (one record without a batch size if it has no
    per-batch metrics, e.g. a run that failed before measuring).

    Args:
        run: the run.
        metrics: metric names to keep (all when ``None``).
    """
    base = _run_base(run)
    per_batch: dict[int, dict[str, float]] = {}
    run_level: dict[str, float] = {}
    for key, value in run.metrics.items():
        parsed = _parsed(key)
        if parsed is None:
            run_level[key] = value
        elif metrics is None or parsed[0] in metrics:
            per_batch.setdefault(parsed[1], {})[parsed[0]] = value
    stepped = {name for values in per_batch.values() for name in values}
    # a stepped metric's run-level value is only its highest step: never spread it to rows
    # (nor a per-batch metric of the schema that this run logged stepped only, without its
    # flat copies: e.g. ``repetitions`` before it was logged flat)
    shared = {
        k: v
        for k, v in run_level.items()
        if k not in stepped and k not in schema.METRICS and (metrics is None or k in metrics)
    }
    if not per_batch:
        return [{**base, **shared, "batch_size": None}]
    return [
        {
            **base,
            **shared,
            **values,
            "batch_size": b,
            "stability": _stability(run.tags, b),
            "stability_reason": run.tags.get(f"{schema.T_STABILITY_REASON}.bs{b}", ""),
            # the guard's word: the figure moved against this engine measured earlier here
            "moved": run.tags.get(f"{schema.T_MOVED}.bs{b}", ""),
            # each batch size's own status (the run's says FAILED or INVALID if any was)
            "status": run.tags.get(f"{schema.T_STATUS}.bs{b}") or base["status"],
        }
        for b, values in per_batch.items()
    ]


def _stability(tags: dict[str, str], batch_size: int) -> str:
    """STABLE / UNSTABLE of one batch size (the run's verdict for a run that logged no
    per-batch one; empty for a run from before the check)."""
    return tags.get(f"{schema.T_STABILITY}.bs{batch_size}") or tags.get(schema.T_STABILITY, "")


def _joined(params: dict[str, str], prefix: str) -> str:
    items = sorted((k[len(prefix) :], v) for k, v in params.items() if k.startswith(prefix))
    return ",".join(f"{k}={v}" for k, v in items)


def _run_base(run: RunData) -> dict:
    params, tags = run.params, run.tags
    base = {
        "run_id": run.run_id,
        "experiment_id": run.experiment_id,
        "start_time": run.start_time,
        "parent_run_id": tags.get(schema.T_PARENT),
        "device": params.get(schema.P_DEVICE),
        "model": params.get(schema.P_MODEL),
        "family": params.get(schema.P_FAMILY),
        "compiler": params.get(schema.P_COMPILER),
        "scenario": params.get(schema.P_SCENARIO, ""),
        "model_params": _joined(params, schema.P_MODEL_PARAM_PREFIX),
        "flags": _joined(params, schema.P_FLAG_PREFIX),
        "status": tags.get(schema.T_STATUS, ""),
        "error": tags.get(schema.T_ERROR, ""),
    }
    if schema.P_PARAMETER_COUNT in params:
        base["parameter_count"] = _number(params[schema.P_PARAMETER_COUNT])
    for key, value in params.items():
        if key.startswith((schema.P_MODEL_PARAM_PREFIX, schema.P_FLAG_PREFIX)):
            base[key] = value
    return base


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def runs_to_frame(runs: Iterable[RunData], metrics: Collection[str] | None = None) -> pd.DataFrame:
    """Flatten runs into the one-row-per-run-x-batch-size DataFrame (``metrics``: the metric
    names to keep, all when ``None``)."""
    records = [record for run in runs for record in run_records(run, metrics)]
    frame = pd.DataFrame.from_records(records)
    if frame.empty:
        return pd.DataFrame(columns=BASE_COLUMNS)
    frame["batch_size"] = frame["batch_size"].astype("Int64")
    return frame


def fetch_cells(
    client: MlflowClient,
    query: RunQuery,
    tracking_uri: str,
    metrics: Collection[str] | None = None,
    live: bool = False,
) -> pd.DataFrame:
    """The cell runs ``query`` needs (its selection plus the identity baselines), flattened
    (``metrics``: the metric names to keep, all when ``None``). They are read from the
    benchmarks' results indexes where those are current, else (or with ``live``) searched.

    Raises:
        NgraphError: an unknown experiment, or no run matching the filters (the message names
            the first filter that matched nothing).
    """
    experiment_ids = resolve_experiments(client, query.experiments)
    if not experiment_ids:
        raise NgraphError("no runs match: the tracking store has no experiments")
    searcher = searcher_for(client, page_size(tracking_uri))
    if live:
        runs = searcher.search_all(experiment_ids, filter_strings(query))
    else:
        runs = indexed_runs(client, searcher, experiment_ids, query)
    log.info("fetched %d cell runs", len(runs))
    if not runs:
        raise NgraphError(explain_empty(client, experiment_ids, query))
    return runs_to_frame(runs, metrics)


def parent_filters(query: RunQuery) -> list[str]:
    """Server-side filters for the parent runs that can hold ``query``'s cells: benchmark
    runs, and tune runs (whose trials are cells)."""
    roles = [f"tags.\"{schema.T_ROLE}\" = '{role}'" for role in PARENT_ROLES]
    sweeps = [f'tags."{schema.T_SWEEP}" = {_quote(s)}' for s in sorted(set(query.sweeps))]
    devices = [f'tags."{schema.T_DEVICE}" = {_quote(d)}' for d in sorted(set(query.devices))]
    return [
        " and ".join([c for c in combo if c])
        for combo in itertools.product(roles, sweeps or [None], devices or [None])
    ]


#: the roles of runs that parent cells (and hold a results index once they finish)
PARENT_ROLES = ("benchmark", "tune")


def matches(run: RunData, query: RunQuery) -> bool:
    """Whether a cell run passes ``query``'s server-side filters (:func:`filter_strings`),
    tested on the client for runs read from an index."""
    params, tags = run.params, run.tags
    if tags.get(schema.T_ROLE) != "cell":
        return False
    if query.valid_only and tags.get(schema.T_STATUS) != schema.STATUS_OK:
        return False
    if query.sweeps and tags.get(schema.T_SWEEP) not in query.sweeps:
        return False
    for attr, param, _ in _PARAM_FILTERS:
        values = set(getattr(query, attr))
        if attr == "compilers" and values:
            values.add(IDENTITY)
        if values and params.get(param) not in values:
            return False
    return all(params.get(key) in values for key, values in query.server_where().items())


def indexed_runs(
    client: MlflowClient, searcher: Searcher, experiment_ids: list[str], query: RunQuery
) -> list[RunData]:
    """The cell runs ``query`` needs: read from the current results index of each benchmark
    run, searched live for the benchmark runs without one (killed, running, or logged
    before indexes existed): their children, and the cells they last logged to (a cell of
    an earlier benchmark that a resumed invocation extended). With no current index at all,
    one live search."""
    from mlflow_ngraph.tracking import index

    parents = searcher.search_all(experiment_ids, parent_filters(query), shard=False)
    current = [p for p in parents if index.is_current(p.status, p.tags)]
    if not current:
        return searcher.search_all(experiment_ids, filter_strings(query))
    current.sort(key=lambda p: int(p.tags[schema.T_INDEX_TIME]))  # newest index wins
    index.max_bytes()  # a bad setting is one error, not one warning per index
    with ThreadPoolExecutor(index.THREADS) as pool:
        indexes = list(pool.map(lambda p: _read_index(client, p), current))
    runs: dict[str, RunData] = {}
    for records in indexes:
        for record in records or ():
            run = from_record(record)
            if matches(run, query):
                runs[run.run_id] = run
    fresh = {p.run_id for p, records in zip(current, indexes) if records is not None}
    stale = [p.run_id for p in parents if p.run_id not in fresh]
    if stale:  # their own cells, and cells of other benchmarks they logged to (resumed)
        children = [
            f"{flt} and tags.\"{tag}\" = '{run_id}'"
            for run_id in stale
            for tag in (schema.T_PARENT, schema.T_LAST_PARENT)
            for flt in filter_strings(query)
        ]
        found = searcher.search_all(experiment_ids, children, shard=False)
        runs.update((run.run_id, run) for run in found)
    log.info("%d indexes, %d benchmark runs searched live", len(current), len(stale))
    return list(runs.values())


def _read_index(client: MlflowClient, parent: RunData) -> list[dict] | None:
    """The records of ``parent``'s results index, or None where it cannot be used (one
    warning): the caller then searches the parent's cells live, as for a parent without one."""
    from mlflow_ngraph.tracking import index

    try:
        return index.read(client, parent.run_id, parent.artifact_uri)
    except index.BadIndex as exc:
        log.warning(
            "the results index (%s) of run %s is unusable: %s; its cells are searched "
            "live instead. Someone who can write the experiment replaced or damaged it: ask "
            "them, or pass --live to read no index",
            index.INDEX_ARTIFACT,
            parent.run_id,
            exc,
        )
        return None


def _any_run(client: MlflowClient, experiment_ids: list[str], query: RunQuery) -> bool:
    return any(
        client.search_runs(experiment_ids, flt, ViewType.ACTIVE_ONLY, max_results=1)
        for flt in filter_strings(query)
    )


def explain_empty(client: MlflowClient, experiment_ids: list[str], query: RunQuery) -> str:
    """One line naming the first filter (in a fixed order) after which nothing matches."""
    scope = f"--experiment {', '.join(query.experiments)}" if query.experiments else "any"
    if not _any_run(client, experiment_ids, RunQuery()):
        hint = f"; {fill_hint(query.experiments[0])}" if len(query.experiments) == 1 else ""
        return f"no runs match: no benchmark cell runs in {scope} experiment{hint}"
    applied: dict = {}
    if query.sweeps:
        applied["sweeps"] = query.sweeps
        if not _any_run(client, experiment_ids, RunQuery(**applied)):
            return f"no runs match --sweep {', '.join(query.sweeps)}: no run of such a sweep"
    for attr, _, option in _PARAM_FILTERS:
        values = getattr(query, attr)
        if not values:
            continue
        applied[attr] = values
        if not _any_run(client, experiment_ids, RunQuery(**applied)):
            return f"no runs match {option} {', '.join(values)} (with the filters before it)"
    where: list[tuple[str, str]] = []
    for key, values in query.server_where().items():
        where += [(key, v) for v in values]
        if not _any_run(client, experiment_ids, RunQuery(**applied, where=tuple(where))):
            return f"no runs match --where {key}={'|'.join(values)} (with the filters before it)"
    return "no runs match --valid-only: every matching run is INVALID or FAILED"
