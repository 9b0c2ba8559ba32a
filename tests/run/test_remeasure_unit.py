"""Which stored measurements ``--remeasure`` makes pending again (no measuring: a journal)."""

from __future__ import annotations

import pytest

from mlflow_ngraph.plan.config import build_spec
from mlflow_ngraph.run.resume import Resume
from mlflow_ngraph.run.runner import plan
from mlflow_ngraph.tracking.journal import Journal


def _stored(tmp_path, unstable: set[tuple[str, int]]):
    """Two models x (identity, torchscript) at bs1 and bs2, logged; ``unstable``: the
    (compiler of the first model, batch size) results judged UNSTABLE."""
    spec = build_spec({
        "models": ["conv_block:width=8,depth=1", "conv_block:width=16,depth=1"],
        "compilers": ["identity", "torchscript"], "batch_sizes": [1, 2],
    })  # fmt: skip
    work = plan(spec)
    journal = Journal(tmp_path / "j.jsonl")
    first = work.cells[0].model
    for cell in work.cells:
        journal.set_run(cell.key, f"run-{cell.key}")
        for b in (1, 2):
            shaky = cell.model is first and (cell.compiler.name, b) in unstable
            stability = {"stable": not shaky, "reason": "wide" if shaky else ""}
            record = {"metrics": {"throughput": 10.0}, "status": "OK", "stability": stability}
            journal.measured(cell.key, b, record)
            journal.logged(cell.key, b)
    return work, journal, Resume(spec, work.cells, journal, None, None)


def _pending(work, journal) -> set[tuple[str, str, int]]:
    return {
        (c.model.label, c.compiler.name, b)
        for c in work.cells
        for b in (1, 2)
        if not journal.done(c.key, b)
    }


def test_unstable_takes_the_whole_group_at_that_batch_size_and_nothing_stable(tmp_path):
    """One compiler UNSTABLE at bs2: every cell of that model at bs2 (its baseline too) is
    pending again, in its own run; bs1 and the other model, all STABLE, are not."""
    work, journal, resume = _stored(tmp_path, {("torchscript", 2)})
    assert resume.unstable_count() == (1, 8)
    assert resume.remeasure("unstable") == 2
    label = work.cells[0].model.label
    assert _pending(work, journal) == {(label, "identity", 2), (label, "torchscript", 2)}
    assert all(journal.cell(c.key).run_id == f"run-{c.key}" for c in work.cells)  # same runs
    # replayed from disk, the journal says the same
    assert _pending(work, Journal(tmp_path / "j.jsonl")) == _pending(work, journal)


def test_all_takes_every_measurement_and_unstable_with_none_leaves_the_journal(tmp_path):
    work, journal, resume = _stored(tmp_path, set())
    size = journal.path.stat().st_size
    assert resume.remeasure("unstable") == 0
    assert journal.path.stat().st_size == size  # nothing written: a finished run stays done
    assert resume.remeasure("all") == 8
    assert len(_pending(work, journal)) == 8


def test_a_bad_mode_is_refused():
    from mlflow_ngraph.errors import NgraphError
    from mlflow_ngraph.run.runner import check_remeasure

    check_remeasure(None)
    check_remeasure("all")
    with pytest.raises(NgraphError, match="--remeasure sometimes: not a choice"):
        check_remeasure("sometimes")
