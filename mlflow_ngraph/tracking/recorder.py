"""The cell recorder: the one MLflow writer of a cell run.

It opens (or finds again) the cell's run and writes its params, tags, per-batch metrics,
engine and log artifacts, relative metrics and final status. It decides nothing about what
was measured: the runner hands it plain records (as the journal holds them). What the
journal holds of a cell and the store lacks (measured while the tracking server was down) it
sends with :meth:`CellRecorder.replay` and :meth:`CellRecorder.close`, for the runner on
its next contact with the server and for ``mlflow-ngraph sync`` alike.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlflow_ngraph import faultpoint
from mlflow_ngraph.measure import metrics as M
from mlflow_ngraph.tracking import mlflow_log as ml
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tracking.engines import engine_param
from mlflow_ngraph.tracking.journal import CellState, Journal
from mlflow_ngraph.tracking.provenance import Producer

#: the tags of a batch size that a result sets only where it has them
_PER_BATCH_TAGS = (*ml.STORED_WORDS.values(), S.T_STABILITY_REASON, S.T_ERROR)


class CellRecorder:
    """Writes one cell's run; ``run_id`` is known once :meth:`open` returned."""

    def __init__(
        self,
        client,
        experiment_id: str,
        parent_id: str,
        log_engines: bool,
        producer: Producer | None = None,
    ) -> None:
        self.client = client
        self.experiment_id = experiment_id
        self.parent_id = parent_id
        self.log_engines = log_engines
        self.producer = producer  # signs every result it logs (None: results go unsigned)

    def open(self, cell_key: str, name: str, known_run: str | None) -> str:
        return ml.cell_run(
            self.client, self.experiment_id, self.parent_id, cell_key, name, known_run
        )

    def params(self, run_id: str, params: dict[str, Any]) -> None:
        ml.log_params_once(self.client, run_id, params)

    def tags(self, run_id: str, tags: dict[str, str]) -> None:
        ml.log_batch(self.client, run_id, tags=tags)

    def record(self, run_id: str, b: int, record: dict, description: dict | None = None) -> None:
        """One measured batch size: its metrics, status tags, runtime params and engine (and
        every request's time, where the paper protocol kept them), then its signed record
        (``description``: the journal's params and tags of the cell it is signed with)."""
        tags = {f"{S.T_STATUS}.bs{b}": record["status"]}
        if self.parent_id:
            tags[S.T_LAST_PARENT] = self.parent_id
        if record.get("reference"):
            tags[S.T_REFERENCE] = record["reference"]
        for key, tag in ml.STORED_WORDS.items():  # read back as they are (stored_results)
            if record.get(key):
                tags[f"{tag}.bs{b}"] = str(record[key])[:5000]
        stability = record.get("stability")
        if stability:
            tags[f"{S.T_STABILITY}.bs{b}"] = (
                S.STABILITY_STABLE if stability["stable"] else S.STABILITY_UNSTABLE
            )
            if stability.get("reason"):
                tags[f"{S.T_STABILITY_REASON}.bs{b}"] = stability["reason"][:5000]
            tags[f"{S.T_ATTEMPTS}.bs{b}"] = str(stability.get("attempts", 1))
        if record.get("times_ms"):  # before the metrics: a run holding a result holds it
            self.client.log_text(run_id, paper_times_csv(record["times_ms"]), S.times_file(b))
        self._drop_replaced(run_id, b, tags)
        ml.log_batch(self.client, run_id, metrics=ml.batch_metrics(record["metrics"], b), tags=tags)
        runtime = record.get("runtime", {})
        # what the runtime chose, per batch size (``runtime.bs<b>.<key>``); ``runtime.<key>``
        # keeps the first batch size's value (params are written once)
        ml.log_params_once(
            self.client,
            run_id,
            {
                **{f"runtime.{k}": v for k, v in runtime.items()},
                **{S.runtime_key(k, b): v for k, v in runtime.items()},
            },
        )
        if record.get("engine_dir") and self.log_engines and Path(record["engine_dir"]).is_dir():
            ml.log_engine(self.client, run_id, Path(record["engine_dir"]), b)
        faultpoint.point("result_unsigned")
        self.sign(run_id, b, record, description)

    def _drop_replaced(self, run_id: str, b: int, tags: dict[str, str]) -> None:
        """A result measured again into its run (``--remeasure``): the batch size's tags the
        new result does not set (a stability reason, a note, an error) are deleted, so that
        nothing of the measurement it replaces is read beside it."""
        held = self.client.get_run(run_id).data.tags
        for name in _PER_BATCH_TAGS:
            key = f"{name}.bs{b}"
            if key in held and key not in tags:
                self.client.delete_tag(run_id, key)

    def sign(
        self,
        run_id: str,
        b: int,
        record: dict,
        description: dict | None,
        manifest_sha256: str | None = None,
    ) -> None:
        """The result's record signed by this producer, to its run (nothing without a
        producer or a description: the result stands, unsigned); ``manifest_sha256``: the
        engine the run pinned, where the record's folder may be gone or rebuilt since."""
        if self.producer is None or description is None:
            return
        if not (self.log_engines and record.get("engine_dir")):
            record = {**record, "engine_dir": None}
        self.producer.sign(
            self.client, run_id, self.experiment_id, b, record, description, manifest_sha256
        )

    def rerun(
        self,
        run_id: str,
        b: int,
        record: dict,
        description: dict | None = None,
        manifest_sha256: str | None = None,
    ) -> None:
        """A result's re-run interval, settled after it was logged (``--sittings``: from the
        whole run's spread between sittings): its metrics and the tag that says where the
        spread came from, then its signed record (``manifest_sha256``: the engine its run
        pinned, where the record's folder may be gone)."""
        metrics = {
            k: v for k, v in record["metrics"].items() if k in S.RERUN_METRICS and v is not None
        }
        tags = {f"{S.T_RERUN}.bs{b}": record["rerun"][:5000]} if record.get("rerun") else {}
        ml.log_batch(self.client, run_id, metrics=ml.batch_metrics(metrics, b), tags=tags)
        faultpoint.point("rerun_unsigned")
        self.sign(run_id, b, record, description, manifest_sha256)

    def failed(self, run_id: str, b: int, reason: str) -> None:
        ml.log_batch(
            self.client,
            run_id,
            tags={f"{S.T_STATUS}.bs{b}": S.STATUS_FAILED, f"{S.T_ERROR}.bs{b}": reason[:5000]},
        )

    def relative(self, run_id: str, values: list[ml.MetricValue], has_baseline: bool) -> None:
        """Relative metrics (speedup, RTR, ASE, BSR, payback); a resume re-logs none the run
        holds (an infinite payback is stored as the largest float)."""
        logged = self.client.get_run(run_id).data.metrics
        changed = [
            (key, value, step)
            for key, value, step in values
            if logged.get(S.flat_key(key.split(".bs")[0], step)) != ml.stored_value(value)
        ]
        note = (
            "identity baseline of this device and model"
            if has_baseline
            else "no identity baseline for this device and model: speedup and BSR not logged"
        )
        ml.log_batch(self.client, run_id, metrics=changed, tags={"ngraph.relative": note})

    def relative_from(
        self, journal: Journal, key: str, run_id: str, baseline: str | None = None
    ) -> None:
        """The relative metrics of cell ``key`` from the throughputs the journal holds (its
        own and those of its identity baseline: the cell key ``baseline``, else the one its
        description names)."""
        state = journal.cell(key)
        baseline = baseline or (state.description or {}).get("baseline")
        identity = journal.cell(baseline).throughputs() if baseline else {}
        values: list[ml.MetricValue] = []
        paired = state.paired_speedups()
        relative = M.relative_metrics(
            state.throughputs(), identity or None, paired, state.compile_times()
        )
        for b, rel in relative.items():
            values += ml.batch_metrics(rel, b)
        self.relative(run_id, values, bool(identity))

    def replay(
        self,
        journal: Journal,
        key: str,
        run_id: str,
        send_record: Callable[[str, int, dict], None] | None = None,
    ) -> int:
        """Send what the journal holds of cell ``key`` to its run (``run_id``): the params
        and tags of its description, every failed batch size, and every result not logged,
        each once (one the run already holds, sent before a kill, is only signed again and
        marked logged), and every re-run interval settled since it was logged that the run
        may lack (sent again, with its signed record).
        ``send_record`` logs one result (default :meth:`record`). Returns results sent."""
        state = journal.cell(key)
        description = state.description or {}
        if description.get("tags"):
            self.tags(run_id, description["tags"])
        if description.get("params"):
            self.params(run_id, description["params"])
        for b, reason in sorted(state.failed.items()):
            if b not in state.measured:
                self.failed(run_id, b, reason)
        held = self.client.get_run(run_id).data
        sent = 0
        for b in state.unlogged():
            if not ml.holds_result(held, b):
                if send_record is None:
                    self.record(run_id, b, state.measured[b], state.description)
                else:
                    send_record(run_id, b, state.measured[b])
                sent += 1
            else:  # sent before a kill, which may have come before its signed record
                self.sign(run_id, b, state.measured[b], state.description)
            journal.logged(key, b)
        for b in sorted(state.settling):  # a settle a kill or the store cut short
            # signed with the engine its run pinned when first logged (write-once): the
            # record's folder may have been pruned or rebuilt since
            pinned = held.params.get(engine_param(b)) if self.log_engines else None
            self.rerun(run_id, b, state.measured[b], state.description, pinned)
            journal.logged(key, b)
        return sent

    def close(
        self,
        journal: Journal,
        key: str,
        run_id: str,
        log_file: Path | None,
        baseline: str | None = None,
    ) -> None:
        """End cell ``key``'s run with what the journal holds: its worker log, relative
        metrics (against ``baseline``, see :meth:`relative_from`) and final status; the
        journal then marks the cell closed."""
        if log_file is not None:
            self.log_file(run_id, log_file, "logs")
        self.relative_from(journal, key, run_id, baseline)
        self._clear_stale(run_id, journal.cell(key))
        self.finish(run_id, *cell_status(journal.cell(key)))
        faultpoint.point("cell_closed_in_store")
        journal.closed(key)

    def _clear_stale(self, run_id: str, state: CellState) -> None:
        """Delete the error tags of failures measured since (``--retry-failed``): the run
        says what the journal says, and a cell with no failure left has no error."""
        tags = self.client.get_run(run_id).data.tags
        stale = [f"{S.T_ERROR}.bs{b}" for b in state.measured if f"{S.T_ERROR}.bs{b}" in tags]
        if not state.failed and S.T_ERROR in tags:
            stale.append(S.T_ERROR)
        if S.T_HOST_ERROR in tags:  # the host failure that interrupted it is behind it
            stale.append(S.T_HOST_ERROR)
        for key in stale:
            self.client.delete_tag(run_id, key)

    def interrupted(self, run_id: str, reason: str) -> None:
        """End a cell's run that the host kept from finishing (KILLED, the reason tagged)."""
        ml.log_batch(self.client, run_id, tags={S.T_HOST_ERROR: reason[:5000]})
        ml.finish(self.client, run_id, "KILLED")

    def log_file(self, run_id: str, path: Path, artifact_path: str) -> None:
        if path.is_file() and path.stat().st_size:
            self.client.log_artifact(run_id, str(path), artifact_path=artifact_path)

    def finish(
        self,
        run_id: str,
        status: str,
        error: str,
        any_measured: bool,
        stable: bool | None = None,
    ) -> None:
        tags = {S.T_STATUS: status}
        if stable is not None:
            tags[S.T_STABILITY] = S.STABILITY_STABLE if stable else S.STABILITY_UNSTABLE
        if error:
            tags[S.T_ERROR] = error[:5000]
        ml.log_batch(self.client, run_id, tags=tags)
        ml.finish(
            self.client,
            run_id,
            "FAILED" if status == S.STATUS_FAILED and not any_measured else "FINISHED",
        )


def cell_status(state: CellState) -> tuple[str, str, bool, bool | None]:
    """A cell's final (status, error, any batch size measured, stable) from its journal
    state: FAILED if a batch size failed, INVALID if an output check failed, else OK."""
    statuses = [r["status"] for r in state.measured.values()]
    if state.failed:
        status, error = S.STATUS_FAILED, next(iter(state.failed.values()))
    elif S.STATUS_INVALID in statuses:
        status, error = S.STATUS_INVALID, "output check failed at some batch size"
    else:
        status, error = S.STATUS_OK, ""
    judged = [r["stability"]["stable"] for r in state.measured.values() if r.get("stability")]
    return status, error, bool(statuses), (all(judged) if judged else None)


def paper_times_csv(times_ms: list[float]) -> str:
    """The paper protocol's request times as CSV: one row per timed request, in order."""
    return "request,time_ms\n" + "".join(f"{i},{t:.6f}\n" for i, t in enumerate(times_ms))
