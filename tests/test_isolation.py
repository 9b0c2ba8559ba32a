"""Each cell in its own process: a crash, a hang or a model that cannot be built fails its
own cells with the reason, and the healthy model of the same run is measured."""

from __future__ import annotations

import pytest

HEALTHY = "conv_block:width=8,depth=1,image_size=32"
HEALTHY_LABEL = "conv_block:depth=1,image_size=32,width=8"
MEASURE = ["--batch-sizes", "1,2", "--warmup", "1", "--repetitions", "3", "--min-duration", "0"]


def _rows(out: str) -> dict[tuple[str, str], str]:
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[2].isdigit():
            rows[(parts[0], parts[2])] = line
    return rows


def _run(run_cli, tracking_uri, models, *extra):
    args = ["benchmark", *MEASURE, "--compiler", "identity", "--tracking-uri", tracking_uri]
    for model in models:
        args += ["--model", model]
    return run_cli(*args, *extra)


def test_crashes_and_a_broken_factory_fail_their_cells_and_the_run_goes_on(run_cli, tracking_uri):
    models = [
        "tests.fixtures.crashing:aborting:input_shape=4",
        "tests.fixtures.crashing:segfaulting:input_shape=4",
        "tests.fixtures.crashing:raising:input_shape=4",
        HEALTHY,
    ]
    code, out, err = _run(run_cli, tracking_uri, models)
    assert code == 0, err
    rows = _rows(out)
    for b in ("1", "2"):
        assert "FAILED" in rows[("tests.fixtures.crashing:aborting:input_shape=4", b)]
        assert "SIGABRT" in rows[("tests.fixtures.crashing:aborting:input_shape=4", b)]
        assert "SIGSEGV" in rows[("tests.fixtures.crashing:segfaulting:input_shape=4", b)]
        assert "cannot build" in rows[("tests.fixtures.crashing:raising:input_shape=4", b)]
        assert " OK" in rows[(HEALTHY_LABEL, b)]
    assert "Traceback" not in err
    # the re-run does not crash the same way: the failures are resumed from the journal
    code, out, err = _run(run_cli, tracking_uri, models)
    assert code == 0, err
    assert out.count("(resumed)") == 8


@pytest.mark.parametrize("isolation", ["process"])
def test_a_hanging_cell_is_killed_at_the_cell_timeout(run_cli, tracking_uri, isolation):
    models = ["tests.fixtures.crashing:hanging:input_shape=4", HEALTHY]
    code, out, err = _run(
        run_cli, tracking_uri, models, "--cell-timeout", "20", "--isolation", isolation
    )
    assert code == 0, err
    rows = _rows(out)
    assert "timed out after 20 s" in rows[("tests.fixtures.crashing:hanging:input_shape=4", "1")]
    assert " OK" in rows[(HEALTHY_LABEL, "2")]
