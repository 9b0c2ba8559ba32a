"""Everything that talks to MLflow while benchmarking: runs, params, metrics, artifacts.

One parent run per benchmark invocation on a device; one nested child run per device x model
x compiler x flags. Child runs are found again by their cell key, so re-running a spec reuses
them instead of creating duplicates. All metrics of a batch size go in one ``log_batch``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from mlflow_ngraph import faultpoint
from mlflow_ngraph.errors import NgraphError, StoreAway
from mlflow_ngraph.redaction import first_line, redact_text
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.variables import ENV_DEVICE_NAME, ENV_PARENT_RUN, ENV_SWEEP_ID

log = logging.getLogger(__name__)

#: (key, value, step)
MetricValue = tuple[str, float, int]

#: MLflow truncates param values at 6000 characters; longer ones go to a JSON artifact.
MAX_PARAM_CHARS = 6000


def redact(uri: str) -> str:
    """``redact_uri`` (the tracking URI as it may be printed)."""
    return redact_uri(uri)


#: the tracking URI the running command resolved last: the store its errors name
_IN_USE: list[str] = []


def resolve_tracking_uri(given: str | None) -> str:
    """The URI given, else ``MLFLOW_TRACKING_URI``, else MLflow's own default (remembered
    as the store in use: :func:`store_in_use`)."""
    if given:
        uri = given
    else:
        import mlflow

        uri = os.environ.get("MLFLOW_TRACKING_URI") or mlflow.get_tracking_uri()
    _IN_USE[:] = [uri]
    return uri


def store_in_use() -> str:
    """The tracking URI the running command resolved last, else ``MLFLOW_TRACKING_URI``
    (unredacted: redact it before it is shown)."""
    return _IN_USE[-1] if _IN_USE else os.environ.get("MLFLOW_TRACKING_URI", "")


def redact_uri(text: str) -> str:
    """``text`` with the secrets of every URI in it replaced by ``***``
    (:func:`mlflow_ngraph.redaction.redact_text`; everything the tool prints or records goes
    through it)."""
    return redact_text(text)


#: MLflow's HTTP client retries 7 times with a backoff of 2 (minutes of silence against a
#: server that is down); the tool bounds it unless the user set these variables
HTTP_LIMITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


def bound_http_retries() -> None:
    for name, value in HTTP_LIMITS.items():
        os.environ.setdefault(name, value)


def connect(tracking_uri: str):
    """An ``MlflowClient`` for ``tracking_uri``, after checking the store answers.

    A local sqlite store that does not exist yet is created whole or not at all; one left
    half-made (a kill while MLflow created its tables) is named with the fix.

    Raises:
        NgraphError: the server is unreachable, refuses the login, or the store cannot be
            opened.
    """
    from mlflow.tracking import MlflowClient

    bound_http_retries()
    shown = redact_uri(tracking_uri)
    if tracking_uri.startswith(("http://", "https://")):
        _check_http(tracking_uri)
    path = local_sqlite(tracking_uri)
    if path is not None:
        _create_sqlite_store(path)
        _check_sqlite_store(path, shown)
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        client.search_experiments(max_results=1)
    except Exception as exc:  # MLflow raises many types for a bad store
        raise store_error(exc, tracking_uri) from None
    return client


#: how a refused login (HTTP 401) reads in MLflow's errors: the status as a word of its own
#: (never the 401 in a port, :34401, or in a run id)
_UNAUTHENTICATED = re.compile(
    r"error code 401\b|(?<![\w:/.-])401 (?:unauthorized|client error)|\bUNAUTHENTICATED\b"
    r"|not authenticated",
    re.IGNORECASE,
)


def login_refused(text: str, shown: str) -> NgraphError | None:
    """The one line of a refused login (401) in a store error's redacted ``text``, else
    ``None``."""
    if _UNAUTHENTICATED.search(text):
        user = os.environ.get("MLFLOW_TRACKING_USERNAME") or "(none)"
        return NgraphError(
            f"tracking server {shown} refused the login of user {user!r}: wrong username or "
            "password (set MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD)"
        )
    return None


#: HTTP 403 as a status, not three digits inside a run id, a digest or a port
_FORBIDDEN = re.compile(r"(?<![\w.:/-])403(?![\w-]|\.\d)|\bPERMISSION_DENIED\b|\bpermission", re.I)
#: either refusal's status as a word, for a quick test of an error of another type
REFUSED_STATUS = re.compile(r"(?<![\w.:/-])40[13](?![\w-]|\.\d)")


def permission_missing(text: str) -> bool:
    """Whether a store error's ``text`` is a refused permission (HTTP 403)."""
    return bool(_FORBIDDEN.search(text))


def refused(exc: BaseException) -> bool:
    """Whether an error of the store is a refused login or permission."""
    text = str(exc)
    code = getattr(exc, "error_code", None)
    return code in ("PERMISSION_DENIED", "UNAUTHENTICATED") or bool(
        _UNAUTHENTICATED.search(text) or REFUSED_STATUS.search(text)
    )


def store_error(exc: BaseException, tracking_uri: str) -> NgraphError:
    """One line for an error of the store: a refused login or permission names the fix."""
    text = redact_uri(str(exc))
    shown = redact_uri(tracking_uri)
    user = os.environ.get("MLFLOW_TRACKING_USERNAME") or "(none)"
    refused = login_refused(text, shown)
    if refused is not None:
        return refused
    if permission_missing(text):
        return NgraphError(
            f"user {user!r} lacks the permission on {shown} to write this experiment's runs "
            "(it needs EDIT or MANAGE; ask the server's admin, or use another --experiment)"
        )
    reason = first_line(text, 200) or type(exc).__name__
    return NgraphError(
        f"tracking store {shown!r} cannot be opened: {reason} "
        "(check --tracking-uri / MLFLOW_TRACKING_URI)"
    )


def store_failed(
    exc: BaseException, tracking_uri: str | None = None, hint: str = ""
) -> NgraphError:
    """One line, redacted, for an error the tracking store (or the way to it) raised while a
    command used it (``tracking_uri``; default :func:`store_in_use`): a refused login or
    permission, a server that does not answer (:class:`StoreAway`), or the store's own
    answer with ``hint`` (what to do about it) or a general one."""
    uri = tracking_uri or store_in_use()
    shown = redact_uri(uri) or "(default)"
    text = redact_uri(str(exc))
    refused = login_refused(text, shown)
    if refused is not None:
        return refused
    if permission_missing(text):
        user = os.environ.get("MLFLOW_TRACKING_USERNAME") or "(none)"
        return NgraphError(
            f"user {user!r} lacks a permission this command needs on {shown}: ask the "
            f"server's admin to grant it ({first_line(text, 200)})"
        )
    if _unreachable(exc) or (uri.startswith(("http://", "https://")) and not store_answers(uri)):
        return StoreAway(
            f"tracking server {shown} is unreachable ({type(exc).__name__}); start it or point "
            "--tracking-uri / MLFLOW_TRACKING_URI at a running server"
        )
    reason = first_line(text) or type(exc).__name__
    return NgraphError(f"the tracking store {shown} failed: {reason}; {hint or _fix(text)}")


#: how the store says that what was asked for is not there
_NOT_FOUND = re.compile(
    r"\b404\b|RESOURCE_DOES_NOT_EXIST|not found|No such file|Failed to download artifacts",
    re.IGNORECASE,
)


def _fix(text: str) -> str:
    if _NOT_FOUND.search(text):
        return (
            "what the command reads is not in the store (deleted by one of its writers?): "
            "log it again, or choose another run"
        )
    return "check the tracking server and the runs' artifacts, then run the command again"


def _unreachable(exc: BaseException) -> bool:
    import requests

    return isinstance(exc, (requests.ConnectionError, requests.Timeout, ConnectionError))


def local_sqlite(tracking_uri: str) -> Path | None:
    """The file of a ``sqlite:///`` tracking URI (query string dropped); ``None`` for any
    other store, in-memory included."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix) or tracking_uri.endswith(":memory:"):
        return None
    return Path(tracking_uri[len(prefix) :].split("?")[0])


def _create_sqlite_store(path: Path) -> None:
    """Create the store in a temporary file beside ``path`` and link it into place: a kill
    while MLflow creates its tables leaves a stray temporary file, never a half-made store,
    and concurrent creators keep exactly one."""
    if path.exists():
        return
    from mlflow.tracking import MlflowClient

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.creating")
    try:
        MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments(max_results=1)
        try:
            os.link(tmp, path)  # fails if another process created it meanwhile
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)


def _check_sqlite_store(path: Path, shown: str) -> None:
    """Raises :class:`NgraphError` naming the fix for a file that is no sqlite database or a
    half-made store. Opened for writing (never created): a run killed in the middle of a
    write leaves a hot journal, which SQLite rolls back at the first read, and only a
    connection that may write can."""
    try:
        with sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=10) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            version = (
                db.execute("SELECT version_num FROM alembic_version").fetchall()
                if "alembic_version" in tables
                else []
            )
    except sqlite3.DatabaseError as exc:
        raise NgraphError(
            f"tracking store {shown} is not an sqlite database ({exc}); move it away or "
            "point --tracking-uri at another file"
        ) from None
    if not {"experiments", "runs"} <= tables or not version:
        raise NgraphError(
            f"tracking store {shown} is a half-made MLflow database (its creation was "
            f"interrupted); it holds no results: delete it (rm {path}) and run again"
        )


def _check_http(uri: str) -> None:
    import requests

    try:
        requests.get(uri.rstrip("/") + "/health", timeout=5)
    except requests.RequestException as exc:
        raise StoreAway(
            f"tracking server {redact_uri(uri)} is unreachable ({type(exc).__name__}); start "
            "it or point --tracking-uri / MLFLOW_TRACKING_URI at a running server"
        ) from None


#: while the tracking store does not answer, the runner asks it again at most this often
#: (seconds): one /health request (or a look at the sqlite file) that gives up after
#: PROBE_TIMEOUT_S, so measuring is never held up for long
PROBE_EVERY_S = 5.0
PROBE_TIMEOUT_S = 2.0
#: a write still waiting after this many seconds has the store probed beside it: a server
#: that hangs (stopped, or cut off by a network that drops packets) is said at once, not
#: after MLflow's timeouts and retries (3 x MLFLOW_HTTP_REQUEST_TIMEOUT)
WATCH_S = 5.0


def store_answers(tracking_uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the store answers a cheap question now: a tracking server its ``/health``, a
    local sqlite store whether its file is a whole MLflow database. Other stores: True
    (MLflow's own calls tell)."""
    if tracking_uri.startswith(("http://", "https://")):
        import requests

        try:
            return requests.get(tracking_uri.rstrip("/") + "/health", timeout=timeout_s).ok
        except requests.RequestException:
            return False
    path = local_sqlite(tracking_uri)
    if path is not None:
        try:
            _check_sqlite_store(path, "")
        except NgraphError:
            return False
        return path.is_file()
    return True


_SAY_LOCK = threading.Lock()


class StoreLink:
    """Whether the tracking store is reachable. The first write that fails with the store
    unreachable (or hangs past :data:`WATCH_S` with the store not answering a probe) is said
    in one warning; from then on the caller skips its writes (the journal holds them) and
    asks :meth:`back` before each, which probes the store at most every
    :data:`PROBE_EVERY_S`."""

    def __init__(self, tracking_uri: str) -> None:
        self.tracking_uri = tracking_uri
        self.offline = False
        self._said = False  # the outage was announced
        self._asked = 0.0

    def _say(self, why: str) -> None:
        with _SAY_LOCK:
            if self._said:
                return
            self._said = True
        log.warning(
            "tracking server %s is unreachable (%s): measuring goes on, every result is kept "
            "in the journal and sent when the server answers again (or by 'mlflow-ngraph sync')",
            redact_uri(self.tracking_uri),
            why,
        )

    @contextlib.contextmanager
    def watch(self):
        """Around one write: if it is still waiting after :data:`WATCH_S` and the store does
        not answer a probe, the outage is said now (the write goes on to MLflow's end)."""

        def check() -> None:
            if not store_answers(self.tracking_uri):
                self._say("no answer")

        timer = threading.Timer(WATCH_S, check)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
        if self._said and not self.offline:  # it was only slow
            self._back()

    def lost(self, exc: BaseException) -> bool:
        """A write failed with ``exc``: True when the store does not answer (offline from
        now on), False when it does (``exc`` is the store's own answer, not an outage)."""
        if not is_store_error(exc) or store_answers(self.tracking_uri):
            return False
        self._say(type(exc).__name__)
        self.offline, self._asked = True, time.monotonic()
        return True

    def back(self, force: bool = False) -> bool:
        """Whether the store can be written: online, or offline and answering again now
        (asked at most every :data:`PROBE_EVERY_S` unless ``force``)."""
        if not self.offline:
            return True
        if not force and time.monotonic() - self._asked < PROBE_EVERY_S:
            return False
        self._asked = time.monotonic()
        if not store_answers(self.tracking_uri):
            return False
        self._back()
        return True

    def _back(self) -> None:
        self.offline = self._said = False
        log.warning(
            "tracking server %s answers again: sending the results kept in the journal",
            redact_uri(self.tracking_uri),
        )


def is_store_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from the tracking store (server down, database gone)."""
    import requests
    from mlflow.exceptions import MlflowException

    return isinstance(exc, (MlflowException, requests.RequestException, ConnectionError))


#: MLflow 3's UI opens an experiment on its GenAI overview unless this experiment tag says
#: the experiment is for model development; then it opens on the runs table.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def ensure_experiment(client, name: str) -> str:
    """The id of experiment ``name``, created if missing; safe when many clients create it
    at once (the store's unique name decides, the losers read the winner's id)."""
    for attempt in range(20):
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            if experiment.lifecycle_stage == "deleted":
                client.restore_experiment(experiment.experiment_id)
            _mark_runs_view(client, experiment)
            return experiment.experiment_id
        try:
            return client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except Exception as exc:  # taken meanwhile (or sqlite busy): read it again
            if not is_store_error(exc):
                raise
            log.debug("creating experiment %s: %s; reading it again", name, exc)
            time.sleep(0.05 * (attempt + 1))
    raise NgraphError(f"experiment {name!r} could neither be found nor created")


def _mark_runs_view(client, experiment) -> None:
    """Open an experiment that has no kind yet on the runs table in MLflow's UI."""
    if EXPERIMENT_KIND_TAG in (experiment.tags or {}):
        return
    try:  # cosmetic: a user who may not edit the experiment is told so by the first write
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    except Exception as exc:
        log.debug("could not tag experiment %s: %s", experiment.experiment_id, exc)


def run_experiment(client, name: str, explicit: bool = False) -> tuple[str, str]:
    """The experiment to log into, as (id, name): the one of the ``mlflow run`` run when
    inside one (the project run becomes the parent), else ``name``.

    Raises:
        NgraphError: inside ``mlflow run``, ``name`` was given explicitly (``-P
            experiment=``) and is not the project run's experiment.
    """
    active = os.environ.get("MLFLOW_RUN_ID")
    if not active:
        return ensure_experiment(client, name), name
    experiment = client.get_experiment(client.get_run(active).info.experiment_id)
    if explicit and experiment.name != name:
        raise experiment_mismatch(name, experiment.name)
    _mark_runs_view(client, experiment)
    return experiment.experiment_id, experiment.name


def experiment_mismatch(name: str, project_experiment: str) -> NgraphError:
    """The error of ``-P experiment`` naming another experiment than the ``mlflow run``'s."""
    return NgraphError(
        f"experiment {name!r} (-P experiment / --experiment) is not the experiment of this "
        f"mlflow run ({project_experiment!r}): choose it with "
        f"'mlflow run . --experiment-name {name} ...' and leave -P experiment out"
    )


def _find_runs(client, experiment_id: str, tags: dict[str, str]) -> list:
    """The runs tagged ``tags``, in the order every client ranks them (:func:`_rank`)."""
    clauses = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    runs = client.search_runs([experiment_id], filter_string=clauses, max_results=100)
    return sorted(runs, key=_rank)


def _rank(run) -> tuple[float, int, str]:
    """Runs of one key, first the one to keep: the earliest landed (:data:`S.T_LANDED`),
    then (runs made before that tag, or by a creator killed before it) the earliest start.
    A tag that is not a finite time (store text is data: "nan" would leave each client's sort
    an order of its own) ranks as one never set."""
    try:
        landed = float(run.data.tags.get(S.T_LANDED) or math.inf)
    except ValueError:
        landed = math.inf
    return landed if math.isfinite(landed) else math.inf, run.info.start_time or 0, run.info.run_id


def _find_run(client, experiment_id: str, tags: dict[str, str]) -> str | None:
    runs = _find_runs(client, experiment_id, tags)
    return runs[0].info.run_id if runs else None


#: how long a client that created a run waits before ranking the runs of its key: the most
#: two clients' clocks may differ by (a run that lands after the ranking says a later time)
SETTLE_S = 0.3
#: how long a client ranking the runs of its key waits for another creator's landed time
#: (its create seen, its tag not yet): a creator killed in between is passed over after this
LANDED_WAIT_S = 10.0


def find_or_create_run(
    client,
    experiment_id: str,
    tags: dict[str, str],
    run_name: str,
    more_tags: dict[str, str] | None = None,
) -> str:
    """The run tagged ``tags``: the first one if any (:func:`_rank`), else a new one created
    with ``tags`` and ``more_tags`` at once (a kill never leaves it half-tagged). Safe when
    several clients ask at once: each creator tags its run with the time the create came
    back (:data:`S.T_LANDED`), waits :data:`SETTLE_S`, and ranks the runs of the key once
    every one it sees has that time; the others delete the run they made. A run that was not
    there when a client ranked landed after it, so it ranks later for every client, however
    long its create took to land (a start time, set when a create is sent, did not: a create
    slow to land on a busy server displaced a run another client had settled on)."""
    with _creators_in_turn(client):
        found = _find_run(client, experiment_id, tags)
        if found:
            return found
        # the creator, as ``pull`` names it
        every = {**tags, **(more_tags or {}), "mlflow.user": run_user()}
        mine = client.create_run(experiment_id, tags=every, run_name=run_name).info.run_id
        landed = time.time()
        if S.T_CELL_KEY in tags:
            faultpoint.point("cell_run_created")
        client.set_tag(mine, S.T_LANDED, repr(landed))
    time.sleep(SETTLE_S)
    winner = _ranked_first(client, experiment_id, tags, mine)
    if winner != mine:
        log.debug("run %s of %s was created twice: keeping %s", mine, tags, winner)
        client.delete_run(mine)
    return winner


def _ranked_first(client, experiment_id: str, tags: dict[str, str], mine: str) -> str:
    """The first run of ``tags`` once every other run of it made in the last minute has its
    landed time (at most :data:`LANDED_WAIT_S`: a creator killed before tagging is passed
    over, ranked after every landed run)."""
    deadline = time.monotonic() + LANDED_WAIT_S
    while True:
        runs = _find_runs(client, experiment_id, tags)
        recent = time.time() * 1000 - 60_000
        pending = [
            r for r in runs
            if r.info.run_id != mine and not r.data.tags.get(S.T_LANDED)
            and (r.info.start_time or 0) > recent
        ]  # fmt: skip
        if not pending or time.monotonic() > deadline:
            return runs[0].info.run_id if runs else mine
        time.sleep(0.05)


@contextlib.contextmanager
def _creators_in_turn(client):
    """On a local sqlite store, this host's clients look for a run and create it one at a
    time (a lock file beside the store). The settle rule alone is not enough there: a create
    that waited on sqlite's write lock longer than :data:`SETTLE_S` lands with the start
    time it was asked with, earlier than a run another client has already settled on (four
    threads at once on a busy host kept two runs of one cell)."""
    path = local_sqlite(str(getattr(client, "tracking_uri", "") or ""))
    if path is None or not path.parent.is_dir():
        yield  # a tracking server: the settle rule
        return
    import fcntl

    try:
        handle = open(path.with_name(path.name + ".ngraph-create.lock"), "a")  # noqa: SIM115
    except OSError:  # a folder this user cannot write: MLflow says so at the create
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_user() -> str:
    """Who creates a run: the tracking server's login, else the local user."""
    import getpass

    try:
        local = getpass.getuser()
    except (OSError, KeyError, ImportError):  # no user name here (a container without passwd)
        local = "unknown"
    return os.environ.get("MLFLOW_TRACKING_USERNAME") or local


def _set_tags_racing(client, run_id: str, tags: dict[str, str]) -> None:
    """Set tags that other clients may be setting on the same run at the same moment (the
    sqlite store inserts a new tag after looking for it, so two inserts can collide): the
    loser tries again, when the tag exists and is updated."""
    for attempt in range(5):
        try:
            for key, value in tags.items():
                client.set_tag(run_id, key, value)
            return
        except Exception as exc:
            if not is_store_error(exc) or attempt == 4:
                raise
            time.sleep(0.05 * (attempt + 1))


def device_name(profile_name: str) -> str:
    """The device a benchmark runs on: the sweep's name for it, else the profile's name."""
    return os.environ.get(ENV_DEVICE_NAME) or profile_name


def parent_run(client, experiment_id: str, spec, profile, environment: dict, tags: dict) -> str:
    """The benchmark's parent run: the ``mlflow run`` run when inside one, else the run of
    an earlier invocation of the same spec on this device, else a new one. Under the
    ``ngraph-ray`` project backend it is the device's run nested under the project's."""
    device = device_name(profile.name)
    role_tags = {S.T_ROLE: "benchmark", S.T_SPEC_HASH: spec.spec_hash, S.T_DEVICE: device}
    if os.environ.get(ENV_PARENT_RUN):
        role_tags[S.T_PARENT] = os.environ[ENV_PARENT_RUN]
    sweep = os.environ.get(ENV_SWEEP_ID)
    try:
        run_id = os.environ.get("MLFLOW_RUN_ID") or find_or_create_run(
            client, experiment_id, role_tags, f"{device}-{spec.spec_hash[:8]}"
        )
        client.update_run(run_id, status="RUNNING")
    except Exception as exc:
        if is_store_error(exc):  # a read-only user, a refused login: one line
            raise store_error(exc, client.tracking_uri) from None
        raise
    params = {
        "device": device,
        "device_profile": profile.name,
        "device_kind": profile.kind,
        "spec_hash": spec.spec_hash,
        "scenario": spec.measure.scenario,
        "batch_sizes": ",".join(str(b) for b in spec.batch_sizes),
        "models": ",".join(m.label for m in spec.models),
        "compilers": ",".join(c.name for c in spec.compilers),
    }
    log_params_once(client, run_id, params)
    all_tags = {**role_tags, **tags, **{f"env.{k}": str(v)[:5000] for k, v in environment.items()}}
    if sweep:
        all_tags[S.T_SWEEP] = sweep
    log_batch(client, run_id, tags=all_tags)
    _log_json(client, run_id, "spec.json", spec.to_dict())
    _log_json(client, run_id, "environment.json", environment)
    return run_id


def cell_run(
    client, experiment_id: str, parent_id: str, cell_key: str, name: str, known: str | None
) -> str:
    """The child run of a cell: the one the journal knows, else one tagged with the cell
    key (a run started by a killed invocation), else a new nested run, created with its
    role and parent tags. A run found again that lacks them (left by an older version
    killed between creating and tagging it) gets them: every result view finds it."""
    role = {S.T_PARENT: parent_id, S.T_ROLE: "cell"}
    if known:
        try:
            run = client.get_run(known)
            if run.info.lifecycle_stage == "active":
                _reopen(client, run, role)
                return known
        except Exception:  # deleted or from another store: look it up by tag instead
            log.info("journal run %s not found; searching by cell key", known)
    runs = _find_runs(client, experiment_id, {S.T_CELL_KEY: cell_key})
    if runs:
        _reopen(client, runs[0], role)
        return runs[0].info.run_id
    return find_or_create_run(client, experiment_id, {S.T_CELL_KEY: cell_key}, name, role)


def _reopen(client, run, role: dict[str, str]) -> None:
    """A cell's run measured again: RUNNING, with the role tags it lacks."""
    missing = {k: v for k, v in role.items() if not run.data.tags.get(k)}
    if missing:
        log.info("cell run %s lacked %s: tagged", run.info.run_id, ", ".join(sorted(missing)))
        _set_tags_racing(client, run.info.run_id, missing)
    client.update_run(run.info.run_id, status="RUNNING")


#: a result's words as its run holds them (``<tag>.bs<b>``), read back into its record: a
#: result read from the store says what it said when measured (the recorder writes them)
STORED_WORDS = {
    "note": "ngraph.note",
    "stop_reason": S.T_STOP_REASON,
    "moved": S.T_MOVED,
    "rerun": S.T_RERUN,
    "sittings_text": S.T_SITTINGS,
}


def stored_results(
    client, run_id: str, batch_sizes: list[int]
) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """What a cell run already holds, as journal records: ``(measured, failed)``. A batch
    size is measured when its throughput is logged (its record: the flat metrics, status,
    note and stability), failed when its status tag is FAILED (with its error). A result
    whose status tag is missing (a writer killed between the store's commit of the metrics
    and of the tags) takes its status from its ``valid`` metric and is marked ``torn``: its
    metrics stand, only its tags are to be written. The result's words come back with it
    (:data:`STORED_WORDS`: the guard's word on a move, the re-run interval's source)."""
    data = client.get_run(run_id).data
    relative = {S.M_SPEEDUP, S.M_RTR, S.M_ASE, S.M_BSR, S.M_PAYBACK}
    measured: dict[int, dict[str, Any]] = {}
    failed: dict[int, str] = {}
    for b in batch_sizes:
        status = data.tags.get(f"{S.T_STATUS}.bs{b}")
        if status == S.STATUS_FAILED:
            failed[b] = data.tags.get(f"{S.T_ERROR}.bs{b}", "FAILED in an earlier run")
            continue
        if S.flat_key(S.M_THROUGHPUT, b) not in data.metrics:
            continue
        torn = status not in (S.STATUS_OK, S.STATUS_INVALID)
        if torn:
            valid = data.metrics.get(S.flat_key(S.M_VALID, b))
            status = S.STATUS_INVALID if valid == 0.0 else S.STATUS_OK
        metrics = {}
        for key, value in data.metrics.items():
            flat = S.parse_flat_key(key)
            if flat and flat[1] == b and flat[0] not in relative:
                metrics[flat[0]] = value
        record: dict[str, Any] = {"metrics": metrics, "status": status, "from_store": run_id}
        if torn:
            record["torn"] = True
        for key, tag in STORED_WORDS.items():  # what the run said of it (the guard's move)
            if data.tags.get(f"{tag}.bs{b}"):
                record[key] = data.tags[f"{tag}.bs{b}"]
        stability = data.tags.get(f"{S.T_STABILITY}.bs{b}")
        if stability:
            record["stability"] = {
                "stable": stability == S.STABILITY_STABLE,
                "reason": data.tags.get(f"{S.T_STABILITY_REASON}.bs{b}", ""),
                "attempts": int(data.tags.get(f"{S.T_ATTEMPTS}.bs{b}", "1")),
            }
        measured[b] = record
    return measured, failed


def holds_result(data, batch_size: int) -> bool:
    """Whether a run's data (``run.data``) holds a measured result of ``batch_size``."""
    status = data.tags.get(f"{S.T_STATUS}.bs{batch_size}")
    return (
        status in (S.STATUS_OK, S.STATUS_INVALID)
        or S.flat_key(S.M_THROUGHPUT, batch_size) in data.metrics
    )


def log_params_once(client, run_id: str, params: dict[str, Any]) -> None:
    """Log params that the run does not have yet (MLflow rejects changing a param)."""
    existing = client.get_run(run_id).data.params
    fresh = {k: param_value(v) for k, v in params.items() if k not in existing}
    log_batch(client, run_id, params=fresh)


def param_value(value: Any) -> str:
    """A param's text as the run holds it (None: ``default``; cut at MLflow's limit)."""
    text = "default" if value is None else str(value)
    return text[:MAX_PARAM_CHARS]


def log_batch(
    client,
    run_id: str,
    metrics: list[MetricValue] | None = None,
    params: dict[str, str] | None = None,
    tags: dict[str, str] | None = None,
) -> None:
    """One batched call for metrics (``(key, value, step)``), params and tags; the client
    splits it at the REST limits (1000 metrics, 100 params/tags)."""
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    client.log_batch(
        run_id,
        metrics=[Metric(k, float(v), now, int(step)) for k, v, step in metrics or []],
        params=[Param(k, str(v)) for k, v in (params or {}).items()],
        tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()],
    )


#: how MLflow's stores keep an infinite metric (the largest float; a payback that never
#: comes is one)
STORED_INF = sys.float_info.max


def stored_value(value: float) -> float:
    """``value`` as the store keeps it: +-inf as +-the largest float."""
    if value in (math.inf, -math.inf):
        return math.copysign(STORED_INF, value)
    return value


def batch_metrics(values: dict[str, float | None], batch_size: int) -> list[MetricValue]:
    """Each value stepped at the batch size, and flat under ``<name>.bs<batch>`` when it is
    one of ``schema.FLAT_METRICS``; missing values (``None``, NaN) are left out, never logged
    as a number."""
    out: list[MetricValue] = []
    for name, value in values.items():
        if value is None or value != value:
            continue
        value = stored_value(value)
        out.append((name, value, batch_size))
        if name in S.FLAT_METRICS:
            out.append((S.flat_key(name, batch_size), value, batch_size))
    return out


def log_engine(client, run_id: str, directory: Path, batch_size: int) -> None:
    """The engine folder as ``engines/bs<b>``, and the sha256 of its manifest as the run's
    param ``engine.bs<b>.manifest_sha256``, first: params are write-once, so whoever can
    write the experiment's artifacts later cannot make ``pull`` accept another engine. An
    engine whose run already holds another hash for the batch size is not logged again.
    Where the run's artifacts are a local folder its files are hard-linked, not copied
    (:func:`~mlflow_ngraph.tracking.engines.link_into`)."""
    from mlflow_ngraph.tracking.engines import (
        MANIFEST,
        engine_param,
        file_sha256,
        link_into,
        local_artifact_dir,
    )

    key = engine_param(batch_size)
    digest = file_sha256(Path(directory) / MANIFEST)
    run = client.get_run(run_id)
    held = run.data.params.get(key)
    if held is None:
        log_batch(client, run_id, params={key: digest})
    elif held != digest:
        log.warning(
            "run %s holds another engine for batch size %d (manifest %s): keeping it",
            run_id,
            batch_size,
            held[:12],
        )
        return
    artifact_path = f"engines/bs{batch_size}"
    local = local_artifact_dir(run.info.artifact_uri)
    if local is not None and link_into(Path(directory), local / artifact_path):
        return  # the cache's files, linked: on disk once
    client.log_artifacts(run_id, str(directory), artifact_path=artifact_path)


def _log_json(client, run_id: str, name: str, data: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
        client.log_artifact(run_id, str(path))


#: MLflow prints a link to every run terminated on a tracking server (and reads the run back
#: to build it); the runner announces only the parent, not one line per cell
_QUIET = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"


def finish(client, run_id: str, status: str = "FINISHED", announce: bool = False) -> None:
    """Terminate a run; with ``announce``, MLflow prints its link (on a tracking server),
    or, when the tracking URI holds a password, the tool prints it without the password."""
    uri = getattr(client, "tracking_uri", "") or ""
    if announce and redact_uri(uri) != uri:
        finish(client, run_id, status)
        run = client.get_run(run_id)
        experiment_url = f"{redact_uri(uri).rstrip('/')}/#/experiments/{run.info.experiment_id}"
        print(f"🏃 View run {run.info.run_name} at: {experiment_url}/runs/{run_id}")
        return
    if announce or os.environ.get(_QUIET):
        client.set_terminated(run_id, status=status)
        return
    os.environ[_QUIET] = "true"
    try:
        client.set_terminated(run_id, status=status)
    finally:
        del os.environ[_QUIET]
