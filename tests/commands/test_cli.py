"""Every bad input: one clear line naming the problem, a non-zero exit, no traceback."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from tests._support import PYTHON, TINY


def _assert_clean_error(code, out, err, fragment):
    assert code != 0
    assert fragment in err
    assert "Traceback" not in err + out
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--model", "no_such_net"], "unknown model 'no_such_net'"),
        (["--compiler", "nope"], "unknown compiler 'nope'"),
        (["--compiler", "onnxruntime:bogus=1"], "has no flag 'bogus'"),
        (["--compiler", "onnxruntime:graph_optimization_level=max"], "graph_optimization_level"),
        (["--device", "tpu"], "unknown device profile 'tpu'"),
        (["--device", "gpu"], "needs a CUDA device"),
        (["--batch-sizes", "0"], "batch size 0 must be a positive integer"),
        (["--batch-sizes", "-4"], "batch size -4 must be a positive integer"),
        (["--compiler", "tensorrt"], "compiler 'tensorrt' is not available"),
        (["--model", "missing.onnx"], "ONNX file 'missing.onnx' does not exist"),
        (["--model", "no_such_pkg.models:build"], "does not import"),
        (["--model", "conv_block:widht=4"], "no init param 'widht'"),
        (["--tracking-uri", "http://127.0.0.1:9"], "unreachable"),
    ],
)
def test_bad_input(run_cli, tracking_uri, args, fragment):
    base = [a for a in TINY]
    if "--model" in args:
        i = base.index("--model")
        del base[i : i + 2]
    if "--batch-sizes" in args:
        i = base.index("--batch-sizes")
        del base[i : i + 2]
    uri = [] if "--tracking-uri" in args else ["--tracking-uri", tracking_uri]
    _assert_clean_error(*run_cli("benchmark", *base, *args, *uri), fragment)


def test_corrupt_onnx_file(run_cli, tracking_uri, tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07not really a protobuf")
    code, out, err = run_cli("benchmark", "--model", str(bad), "--tracking-uri", tracking_uri)
    _assert_clean_error(code, out, err, "is not a valid ONNX model")


def test_malformed_yaml(run_cli, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("models: [resnet18\n  batch_sizes: 1")
    _assert_clean_error(*run_cli("benchmark", "--spec", str(spec)), "is not valid YAML")


def test_no_traceback_from_the_console_script(tmp_path):
    result = subprocess.run(
        [PYTHON, "-m", "mlflow_ngraph", "benchmark", "--model", "resnet18", "--batch-sizes", "0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "error: batch size 0 must be a positive integer"


def test_compilers_lists_all_with_availability(run_cli):
    code, out, _ = run_cli("compilers")
    assert code == 0
    for name in (
        "identity",
        "torchscript",
        "inductor",
        "onnxruntime",
        "openvino",
        "tvm",
        "tensorrt",
    ):
        assert name in out
    line = next(line for line in out.splitlines() if line.startswith("tensorrt"))
    assert " no " in line and "tensorrt" in line


def test_models_lists_the_paper_models_with_family(run_cli):
    code, out, _ = run_cli("models")
    assert code == 0
    for name, family in [
        ("resnet101", "resnet"),
        ("efficientnet_b5", "efficientnet"),
        ("deit3_base_patch16_224", "deit"),
        ("swin_s3_base_224", "swin"),
        ("convnext_base", "convnext"),
        ("conv_block", "conv_block"),
    ]:
        assert any(line.split() == [name, family] for line in out.splitlines()), name


@pytest.mark.parametrize("command", ["benchmark", "compilers", "models", "compare"])
def test_help(run_cli, command):
    code, out, _ = run_cli(command, "--help")
    assert code == 0 and "Usage" in out


def test_failing_compiler_marks_cell_failed_and_run_goes_on(run_cli, tracking_uri):
    """A model TorchScript cannot trace (data-dependent control flow) fails only its cell."""
    code, out, err = run_cli(
        "benchmark",
        "--model",
        "tests.fixtures.models:untraceable:input_shape=4",
        "--compiler",
        "identity",
        "--compiler",
        "torchscript",
        "--batch-sizes",
        "1",
        "--warmup",
        "0",
        "--repetitions",
        "2",
        "--min-duration",
        "0",
        "--tracking-uri",
        tracking_uri,
    )
    assert code == 0, err
    rows = [
        line.split() for line in out.splitlines() if "tests.fixtures.models:untraceable" in line
    ]
    statuses = {r[1]: r for r in rows}
    assert "OK" in statuses["identity"]
    assert "FAILED" in statuses["torchscript"]


def test_blocks_runs_the_depth_width_grid():
    """The grid ``blocks`` plans: every kind x width x depth, one cell each, into
    ``ngraph-blocks`` (the plan the runner measures; ``--small`` below runs one for real)."""
    from mlflow_ngraph.commands.cli import spec_of
    from mlflow_ngraph.plan.config import build_spec
    from mlflow_ngraph.run.runner import plan

    args = ["blocks", "--kinds", "conv_block,mha_block", "--widths", "16,32", "--depths", "1-2",
            "--batch-sizes", "1", "--compiler", "identity"]  # fmt: skip
    spec = build_spec(spec_of(args))
    assert spec.experiment == "ngraph-blocks" and spec.batch_sizes == [1]
    cells = plan(spec).cells
    grid = [(c.model.name, c.model.params["width"], c.model.params["depth"]) for c in cells]
    assert sorted(grid) == sorted(
        (k, w, d) for k in ("conv_block", "mha_block") for w in (16, 32) for d in (1, 2)
    )
    assert {c.compiler.name for c in cells} == {"identity"}


def test_blocks_small_grid_measures_like_the_default_experiment(run_cli, tracking_uri):
    from mlflow.tracking import MlflowClient

    code, out, err = run_cli("blocks", "--small", "--kinds", "mha_block", "--widths", "16",
                             "--depths", "1", "--compiler", "identity",
                             "--tracking-uri", tracking_uri)  # fmt: skip
    assert code == 0, err
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("ngraph-blocks")
    (cell,) = [
        r
        for r in client.search_runs([exp.experiment_id])
        if r.data.tags.get("ngraph.role") == "cell"
    ]
    params, metrics = cell.data.params, cell.data.metrics
    assert (params["warmup"], params["repetitions"], params["min_duration_s"]) == ("3", "10", "0.5")
    assert {k for k in metrics if k.startswith("throughput.bs")} == {
        "throughput.bs1",
        "throughput.bs8",
    }


def test_blocks_bad_depths(run_cli):
    code, out, err = run_cli("blocks", "--depths", "one-six")
    assert code == 2 and "depths 'one-six' is not an integer (expected e.g. 1,2,4 or 1-6)" in err


def test_compare_is_listed_with_its_own_help_without_importing_it():
    """`compare` is imported only when run: the listing shows the same line as the real one."""
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from mlflow_ngraph.commands.cli import cli\n"
        "out = CliRunner().invoke(cli, ['--help']).output\n"
        "print('compare-imported' if 'mlflow_ngraph.commands.report' in sys.modules else '')\n"
        "print('mlflow-imported' if 'mlflow' in sys.modules else '')\n"
        "print(out)\n"
    )
    lazy = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True)
    assert "compare-imported" not in lazy.stdout and "mlflow-imported" not in lazy.stdout
    listed = [line.split(None, 1) for line in lazy.stdout.splitlines() if line.strip()]
    compare_line = next(parts[1] for parts in listed if parts[0] == "compare")

    from click.testing import CliRunner

    from mlflow_ngraph.commands.cli import cli
    from mlflow_ngraph.commands.report import compare

    eager = CliRunner().invoke(cli, ["compare", "--help"])  # imports and registers the real one
    assert eager.exit_code == 0 and "--experiment" in eager.output
    assert cli.get_command(None, "compare") is compare
    listing = CliRunner().invoke(cli, ["--help"]).output  # now from the real command
    assert re.search(r"compare\s+" + re.escape(compare_line), listing)


@pytest.mark.e2e
def test_timm_names_are_checked_from_the_cache_without_importing_timm(tmp_path):
    """The first check writes timm's model names under the home; later ones skip `import timm`
    (seconds); an unknown name is still refused by timm itself."""
    code = (
        "import sys\n"
        "from mlflow_ngraph.models.registry import validate_model_spec\n"
        f"validate_model_spec('resnet18', {{}}, {str(tmp_path)!r})\n"
        "validate_model_spec('resnet18.a1_in1k', {}, " + repr(str(tmp_path)) + ")\n"
        "print('timm' in sys.modules, 'torch' in sys.modules)\n"
    )
    first = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True)
    assert first.stdout.split() == ["True", "True"]
    assert list((tmp_path / "timm-models").glob("timm-*.txt"))
    second = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True)
    assert second.stdout.split() == ["False", "False"]

    from mlflow_ngraph.errors import NgraphError
    from mlflow_ngraph.models.registry import validate_model_spec

    with pytest.raises(NgraphError, match="unknown model 'no_such_net'"):
        validate_model_spec("no_such_net", {}, tmp_path)


def test_block_params_are_checked_without_building_the_block():
    code = (
        "import sys\n"
        "from mlflow_ngraph.models.registry import validate_model_spec\n"
        "validate_model_spec('conv_block', {'width': 8, 'depth': 2})\n"
        "validate_model_spec('mha_block', {'width': 64, 'heads': 4})\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

    from mlflow_ngraph.errors import NgraphError
    from mlflow_ngraph.models.registry import validate_model_spec

    with pytest.raises(NgraphError, match="not divisible by heads=8"):
        validate_model_spec("mha_block", {"width": 60})
    with pytest.raises(NgraphError, match="no init param 'widht'"):
        validate_model_spec("conv_block", {"widht": 4})


def test_ctrl_c_promises_a_resume_only_where_a_rerun_resumes():
    from mlflow_ngraph.commands.cli import _interrupted

    assert _interrupted(["benchmark", "--spec", "smoke"]).endswith("run the same command to resume")
    assert _interrupted(["-v", "sweep", "s.yaml"]).endswith("resume")
    assert _interrupted(["compare", "-e", "x"]) == "interrupted"
    assert _interrupted(["pull", "-e", "x"]) == "interrupted"


def test_ctrl_c_inside_a_finalizer_ends_the_run_without_a_traceback(capsys):
    """SIGINT that lands while a finalizer runs (SQLAlchemy's, in a garbage collection) is
    raised again where it ends the run, not printed as "Exception ignored" and dropped."""
    import signal

    from mlflow_ngraph.commands.cli import _interrupts_end_the_run

    class Finalized:
        def __del__(self):
            raise KeyboardInterrupt

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal
    try:
        with pytest.raises(KeyboardInterrupt):
            with _interrupts_end_the_run():
                Finalized()
                time.sleep(5)  # the interrupt lands within the block
    finally:
        signal.signal(signal.SIGINT, before)
    assert "Exception ignored" not in capsys.readouterr().err


def test_a_database_error_mlflow_logs_with_its_traceback_is_left_to_the_one_line(caplog):
    """MLflow's database store logs a database error with its traceback before raising it
    (seen when Ctrl-C landed in a commit on a locked sqlite store); the CLI says what it
    means in one line, so the traceback is not printed. Its other errors still are."""
    import logging

    from mlflow_ngraph.console import setup_logging

    setup_logging(0)
    setup_logging(0)  # once per command: the filter is not added twice
    store_log = logging.getLogger("mlflow.store.db.utils")
    assert len(store_log.filters) == 1
    with caplog.at_level(logging.ERROR):
        try:
            raise RuntimeError("database is locked")
        except RuntimeError:
            store_log.exception("SQLAlchemy database error. The following exception is caught.")
        store_log.error("a plain error")
    assert [r.getMessage() for r in caplog.records] == ["a plain error"]


@pytest.fixture
def terminal_sigint():
    """SIGINT as a terminal's Python has it (a suite started in the background or under
    nohup inherits it ignored, and a Ctrl-C test would then see nothing)."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("terminal_sigint")
def test_ctrl_c_during_a_store_write_is_raised_when_the_write_ends():
    """A store write is never cut inside its transaction (cut in a commit, it left the
    sqlite store locked and the parent RUNNING); a second Ctrl-C is raised at once."""
    import signal

    import pytest

    from mlflow_ngraph.tracking.session import interrupts_after

    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_after():
            signal.raise_signal(signal.SIGINT)
            done.append("the write went on")
    assert done == ["the write went on"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        with interrupts_after():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)  # pressed again: at once
            done.append("never")
    assert done == ["the write went on"]


@pytest.mark.usefixtures("terminal_sigint")
def test_ctrl_c_waits_at_most_two_seconds_for_a_store_write_that_hangs():
    import signal
    import time

    import pytest

    from mlflow_ngraph.tracking.session import LATEST_S, interrupts_after

    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with interrupts_after():
            signal.raise_signal(signal.SIGINT)
            time.sleep(30)  # a write that hangs (a store that does not answer)
    assert LATEST_S <= time.monotonic() - began < LATEST_S + 5
