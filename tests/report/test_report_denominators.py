"""One rule for every relative metric: only OK measurements enter it (``schema.is_usable``).

An INVALID result (its outputs failed the check) is neither a baseline (identity throughput
for speedup, T_c(1) for RTR / ASE, ASE_identity for BSR) nor a result. The values the runner
logs to MLflow (from the journal, through the cell recorder) and the ones ``compare``
recomputes from the same store follow it alike.
"""

from __future__ import annotations

from click.testing import CliRunner
from mlflow.tracking import MlflowClient
from report_data import one, records_of

from mlflow_ngraph.commands.report import compare
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tracking.journal import Journal
from mlflow_ngraph.tracking.recorder import CellRecorder

#: (status, throughput) by batch size: the identity's batch 8 and openvino's batch 1 INVALID
IDENTITY = {1: (S.STATUS_OK, 100.0), 2: (S.STATUS_OK, 150.0), 8: (S.STATUS_INVALID, 400.0)}
OPENVINO = {1: (S.STATUS_INVALID, 1000.0), 2: (S.STATUS_OK, 300.0), 8: (S.STATUS_OK, 800.0)}


def _log_cells(tmp_path):
    """Both cells measured into a journal and logged as the runner does (record, then
    close with the relative metrics from the journal) into a real sqlite store."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("rule", artifact_location=str(tmp_path / "art"))
    parent = client.create_run(exp, tags={S.T_ROLE: "benchmark", S.T_DEVICE: "cpu"}).info.run_id
    journal = Journal(tmp_path / "journal.jsonl")
    recorder = CellRecorder(client, exp, parent, log_engines=False)
    runs = {}
    for compiler, series in (("identity", IDENTITY), ("openvino", OPENVINO)):
        key = f"cpu|resnet18|{compiler}"
        run_id = recorder.open(key, f"resnet18 {compiler}", None)
        recorder.params(
            run_id,
            {
                S.P_DEVICE: "cpu",
                S.P_MODEL: "resnet18",
                S.P_COMPILER: compiler,
                S.P_FAMILY: "resnet",
                S.P_SCENARIO: "throughput",
            },
        )
        for b, (status, tput) in series.items():
            valid = float(status == S.STATUS_OK)
            record = {
                "metrics": {S.M_THROUGHPUT: tput, S.M_VALID: valid, S.M_REPETITIONS: 10},
                "status": status,
            }
            journal.measured(key, b, record)
            recorder.record(run_id, b, record)
        baseline = "cpu|resnet18|identity" if compiler != "identity" else None
        recorder.close(journal, key, run_id, None, baseline)
        runs[compiler] = run_id
    client.set_terminated(parent)
    return uri, client, journal, runs


def test_invalid_results_are_no_denominators_in_mlflow_or_compare(tmp_path):
    uri, client, journal, runs = _log_cells(tmp_path)
    # what the runner's summary and the recorder take: OK throughputs only
    assert journal.cell("cpu|resnet18|openvino").throughputs() == {2: 300.0, 8: 800.0}
    assert journal.cell("cpu|resnet18|identity").throughputs() == {1: 100.0, 2: 150.0}

    logged = client.get_run(runs["openvino"]).data.metrics
    assert logged["speedup.bs2"] == 2.0  # both sides OK
    # identity's batch 8 is INVALID: no speedup; openvino's batch 1 is INVALID: no T_c(1),
    # so no RTR / ASE / BSR anywhere, and the INVALID batch 1 gets no metric of its own
    for key in ("speedup.bs8", "speedup.bs1", "rtr.bs2", "rtr.bs8", "ase.bs8", "bsr.bs2"):
        assert key not in logged, key
    ident = client.get_run(runs["identity"]).data.metrics
    assert ident["rtr.bs2"] == 1.5 and "rtr.bs8" not in ident and "speedup.bs8" not in ident

    result = CliRunner().invoke(compare, ["--tracking-uri", uri, "--format", "json"])
    rows = records_of(result)
    relative = ("speedup", "rtr", "ase", "bsr")
    for b in (1, 2, 8):
        row = one(rows, compiler="openvino", batch_size=b)
        assert row["status"] == OPENVINO[b][0]  # each batch size's own status
        computed = {m: row[m] for m in relative if row[m] is not None}
        stored = {m: logged[f"{m}.bs{b}"] for m in relative if f"{m}.bs{b}" in logged}
        assert computed == stored, b  # one rule: compare recomputes what MLflow holds
    assert one(rows, compiler="openvino", batch_size=8)["missing"] == (
        "speedup, bsr: identity not measured OK at batch 8; rtr, ase, bsr: no OK batch-1 throughput"
    )
