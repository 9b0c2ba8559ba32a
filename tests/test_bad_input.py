"""Bad values as a user types them: one ``error:`` line and exit 2 before anything is
measured or any run is created."""

from __future__ import annotations

from pathlib import Path

import pytest

BASE = ["--model", "conv_block:width=8,depth=1,image_size=32", "--compiler", "identity"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--min-duration", "inf"], "min-duration must be a finite"),
        (["--min-duration", "nan"], "min-duration must be a finite"),
        (["--min-duration", "-1"], "min-duration must be a finite"),
        (["--max-duration", "nan"], "max-duration must be a finite"),
        (["--min-duration", "2", "--max-duration", "1"], "below min-duration"),
        (["--tolerance", "nan"], "tolerance must be a finite number > 0"),
        (["--tolerance", "-0.1"], "tolerance must be a finite number > 0"),
        (["--tolerance", "inf"], "tolerance must be a finite number > 0"),
        (["--atol", "nan"], "atol must be a finite number >= 0"),
        (["--atol", "-1"], "atol must be a finite number >= 0"),
        (["--rtol", "inf"], "rtol must be a finite number >= 0"),
        (["--experiment", "x" * 1000], "MLflow allows at most 500"),
        (["--tracking-uri", "htp://127.0.0.1:5000"], "unknown scheme 'htp'"),
        (["--tracking-uri", "sqlite:////etc/passwd/x.db"], "which is a file"),
        (["--tracking-uri", "sqlite:////tmp"], "is a folder, not an sqlite file"),
        (["--tracking-uri", "sqlite:////proc/ngraph.db"], "cannot be written"),
        (["--cell-timeout", "0"], "cell-timeout must be"),
        (["--cell-timeout", "-5"], "cell-timeout must be"),
        (["--cell-timeout", "nan"], "cell-timeout must be"),
        (["--max-interval", "nan"], "max-interval must be"),
        (["--precision", "0"], "precision must be"),
        (["--max-other-cpu", "150"], "max-other-cpu must be"),
        (["--stable-retries", "-1"], "stable-retries must be"),
        (["--rerun-sd", "-0.01"], "rerun-sd must be a fraction in [0, 1)"),
        (["--rerun-sd", "inf"], "rerun-sd must be a fraction in [0, 1)"),
        (["--batch-sizes", "0"], "batch size 0 must be a positive integer"),
        (["--batch-sizes", "1,0,2"], "batch size 0 must be a positive integer"),
        (["--batch-sizes", "1,x"], "batch size 'x' is not an integer"),
        (["--experiment", "   "], "experiment name is blank"),
    ],
)
def test_bad_value_is_one_error_line(run_cli, tmp_path, args, fragment):
    _refused(run_cli, tmp_path, ["benchmark", *BASE], args, fragment)


def _refused(run_cli, tmp_path: Path, command: list[str], args: list[str], fragment: str):
    db = tmp_path / "store.db"
    uri = [] if "--tracking-uri" in args else ["--tracking-uri", f"sqlite:///{db}"]
    code, out, err = run_cli(*command, *uri, *args)
    assert code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and fragment in lines[-1], err
    assert "Traceback" not in err
    assert not db.exists()  # nothing was opened, so no run can be left RUNNING


def _home_is_a_file(tmp_path: Path) -> Path:
    path = tmp_path / "afile"
    path.write_text("not a directory")
    return path


def _home_below_a_file(tmp_path: Path) -> Path:
    return _home_is_a_file(tmp_path) / "home"


@pytest.mark.parametrize(
    ("make_home", "fragment"),
    [(_home_is_a_file, "is a file"), (_home_below_a_file, "cannot be written")],
)
def test_a_home_that_cannot_be_used_leaves_no_run(run_cli, tmp_path, make_home, fragment):
    db = tmp_path / "store.db"
    home = make_home(tmp_path)
    code, out, err = run_cli(
        "benchmark", *BASE, "--tracking-uri", f"sqlite:///{db}", "--home", str(home)
    )
    assert code == 2, err
    assert err.strip().splitlines()[-1].startswith("error: home ") and fragment in err
    assert not db.exists()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--precision", "0"], "--precision must be a fraction in (0, 1)"),
        (["--final-precision", "1.5"], "--final-precision must be a fraction in (0, 1)"),
        (["--final-precision", "nan"], "--final-precision must be a fraction in (0, 1)"),
        (["--min-duration", "2", "--max-duration", "1"], "below min-duration"),
        (["--min-duration", "-1"], "min-duration must be a finite"),
        (["--final-max-duration", "0"], "--final-max-duration must be seconds > 0"),
        (["--final-max-duration", "inf"], "--final-max-duration must be seconds > 0"),
    ],
)
def test_a_bad_tune_setting_is_one_error_line(run_cli, tmp_path, args, fragment):
    _refused(run_cli, tmp_path, ["tune", "--model", BASE[1]], args, fragment)


@pytest.mark.parametrize("uri", ["sqlite:/x.db", "sqlite://x"])
@pytest.mark.parametrize(
    "command",
    [
        ["benchmark", *BASE],
        ["compare"],
        ["tune", "--model", "conv_block", "--compiler", "onnxruntime"],
        ["register", "-e", "x", "--device", "cpu", "--model", "conv_block"],
        ["pull", "-e", "x", "--device", "cpu", "--model", "conv_block", "-o", "out"],
        ["serve", "models:/x@cpu"],
        ["sync"],
    ],
    ids=lambda c: c[0] if isinstance(c, list) else c,
)
def test_a_malformed_store_uri_from_the_environment_is_one_line(run_cli, monkeypatch, command, uri):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    code, out, err = run_cli(*command)
    assert code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    # compare's errors are click's (``Error:``), the others' the CLI's own (``error:``)
    assert lines[-1].lower().startswith(f"error: tracking uri '{uri}' is malformed"), err
    assert "Traceback" not in err
