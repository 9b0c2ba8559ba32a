"""``mlflow-ngraph pull``, ``run-engine`` and ``register``."""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from pathlib import Path

import click
import numpy as np

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.text import visible


def say(text: str) -> None:
    """One line of output holding values from the store (run ids, labels, user names, flags):
    shown :func:`~mlflow_ngraph.text.visible`, never an escape sequence for the terminal."""
    click.echo(visible(text))


def _selection_options(command):
    options = [
        click.option("-e", "--experiment", required=True, help="Experiment name or id."),
        click.option("--device", required=True, help="Device the cells ran on."),
        click.option(
            "--model", required=True, help="Model name, or NAME:k=v,... for one configuration."
        ),
        click.option("--compiler", help="Only this compiler."),
        click.option("--batch-size", type=int, help="Only this batch size."),
        click.option(
            "--metric",
            type=click.Choice(["throughput", "latency_p50_ms", "latency_p99_ms"]),
            default="throughput",
            show_default=True,
            help="What 'best' means (throughput: highest; latencies: lowest).",
        ),
        click.option("--max-latency-ms", type=float, help="Cap on the p99 latency (ms)."),
        click.option(
            "--min-qps",
            type=float,
            help="Only engines whose `loadgen` Server "
            "run held at least this many queries/s (at --latency-bound, 50 ms "
            "unless given).",
        ),  # fmt: skip
        click.option(
            "--latency-bound",
            type=float,
            metavar="MS",
            help="Only engines "
            "with a VALID `loadgen` Server result at a p99 bound of MS or "
            "tighter.",
        ),  # fmt: skip
        click.option("--run", "run_id", help="Only this cell run."),
        click.option(
            "--allow-unstable",
            is_flag=True,
            help="Also consider measurements judged UNSTABLE (set aside by default).",
        ),
        click.option("--live", is_flag=True, help="Search cell runs instead of results indexes."),
        click.option("--tracking-uri", help="Default: MLFLOW_TRACKING_URI, then MLflow's."),
    ]
    for option in reversed(options):
        command = option(command)
    return signature_options(command)


def signature_options(command):
    """``--trusted-keys`` and ``--allow-unsigned``: whose signed results a command deploys."""
    command = click.option(
        "--allow-unsigned",
        is_flag=True,
        default=None,
        help="Also take engines no trusted producer signed (said on every line that shows "
        "one; or set MLFLOW_NGRAPH_ALLOW_UNSIGNED=1).",
    )(command)
    return trusted_keys_option(
        "A trusted-producers file (a team's shared one) instead of your home's (or set "
        "MLFLOW_NGRAPH_TRUSTED_KEYS)."
    )(command)


def trusted_keys_option(help_text: str):
    """``--trusted-keys FILE``, with the command's own help."""
    return click.option("--trusted-keys", type=click.Path(dir_okay=False), help=help_text)


#: how many times a selection is made again without the runs refused for their index record
MAX_ROUNDS = 5


def _trust_option(command):
    return click.option(
        "--trust-code",
        is_flag=True,
        default=None,
        help="Load an engine that runs code (TVM library, TorchScript, AOTInductor package, "
        "TensorRT plan, ONNX Runtime's TensorRT engine cache): only if you trust every writer "
        "of its experiment "
        "(or set MLFLOW_NGRAPH_TRUST_CODE=1).",
    )(command)


def _sha256_option(command):
    return click.option(
        "--sha256",
        help="Pin the engine: the sha256 of its manifest.json (as pull prints it); anything "
        "else is refused.",
    )(command)


def experiment_ids(client, experiment: str) -> set[str]:
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(experiment)
    if found is None and experiment.isdigit():
        try:
            found = client.get_experiment(experiment)
        except MlflowException:
            found = None
    return {str(found.experiment_id)} if found is not None else set()


@contextmanager
def store_errors(uri: str | None, experiment: str, permission: str, on: str = "experiment"):
    """Any error of the tracking store (``uri``; default: the one the command resolved) as
    one redacted line: a refused login or a missing permission names what it was refused on
    (``on`` ``experiment``, or the registered model a ``models:/`` URI names) and the
    permission the command needs, anything else the store and its answer; never MLflow's
    traceback."""
    from mlflow_ngraph.tracking.mlflow_log import REFUSED_STATUS, is_store_error

    try:
        yield
    except NgraphError:  # already the command's own line (its digests may hold "403")
        raise
    except Exception as exc:  # MLflow's, requests' and MLflow's REST errors of other types
        if not is_store_error(exc) and not REFUSED_STATUS.search(str(exc)):
            raise
        raise _auth_error(exc, uri, f"{on} {experiment!r}", permission) from None


def _auth_error(exc: BaseException, uri: str | None, target: str, permission: str):
    import os

    from mlflow_ngraph.tracking.index import index_hint
    from mlflow_ngraph.tracking.mlflow_log import (
        login_refused,
        permission_missing,
        redact_uri,
        store_failed,
        store_in_use,
    )

    text = redact_uri(str(exc))
    user = os.environ.get("MLFLOW_TRACKING_USERNAME") or "(none)"
    shown = redact_uri(uri or store_in_use())
    refused = login_refused(text, shown)
    if refused is not None:
        return refused
    if permission_missing(text):
        return NgraphError(
            f"user {user!r} lacks the {permission} permission on {target} "
            f"at {shown}: ask the server's admin to grant it"
        )
    return store_failed(exc, uri, hint=index_hint(str(exc)))


def _choose(options: dict):
    """Connect, select, check the choice against its run and print it; returns (client,
    uri, chosen candidate, its run, selection)."""
    from mlflow_ngraph.deploy.bound import check_wanted, held, server_bounds, set_aside
    from mlflow_ngraph.deploy.select import confirm, creator, describe, rank
    from mlflow_ngraph.deploy.signed import Trust
    from mlflow_ngraph.tracking.mlflow_log import connect, resolve_tracking_uri
    from mlflow_ngraph.tracking.uri import check_tracking_uri

    if options["max_latency_ms"] is not None and not options["max_latency_ms"] > 0:
        raise NgraphError(f"--max-latency-ms must be > 0, got {options['max_latency_ms']}")
    uri = resolve_tracking_uri(options["tracking_uri"])
    check_tracking_uri(uri)
    client = connect(uri)
    ids = experiment_ids(client, options["experiment"])
    what = f"{options['model']} on {options['device']}"
    bound_ms = check_wanted(options["min_qps"], options["latency_bound"])
    trust = Trust.of(options["trusted_keys"], options["allow_unsigned"])
    refused: set[str] = set()
    shown = False
    for _ in range(MAX_ROUNDS):
        found = _verified_candidates(client, uri, options, trust, refused)
        if bound_ms is not None:
            set_aside(client, found, bound_ms, options["min_qps"])
        selection = rank(
            found, options["metric"], options["max_latency_ms"], options["allow_unstable"]
        )
        if not shown:  # once: later rounds only leave out runs refused in a line each
            click.echo(describe(selection))
            shown = True
        ranked = _trusted_best(selection, what, trust)
        chosen, run = confirm(client, ranked, ids, say, refused)
        if chosen is not None:
            break
    else:
        raise NgraphError(
            f"no run backs its results-index record among {len(refused)} refused (see the "
            "lines above): nothing chosen; the experiment's results indexes were altered"
        )
    signed = f"signed by {chosen.signer}" if chosen.signer else "UNSIGNED: " + chosen.unsigned
    say(f"chose {chosen.label} (run {chosen.run_id}, logged by {creator(run)}, {signed})")
    chosen.server = chosen.server or held(server_bounds(client, chosen), None, None)
    if chosen.server is not None:
        say(f"it held {chosen.server.text()} (loadgen run {chosen.server.run_id})")
    return client, uri, chosen, run, selection


def _verified_candidates(client, uri: str, options: dict, trust, refused: set[str]) -> list:
    """The candidates (``select.candidates``), each verified against its signed record.
    Runs no trusted producer signed are looked past once: a planted record may be the
    latest of its cell and hide the signed run behind it; when looking past them finds more
    trusted candidates, each is refused in one line and added to ``refused``."""
    from mlflow_ngraph.deploy.select import candidates
    from mlflow_ngraph.deploy.signed import verify_candidates

    def look(excluded: set[str]) -> list:
        found = candidates(client, uri, options["experiment"], options["device"],
                           options["model"], options["compiler"], options["batch_size"],
                           options["run_id"], options["live"], frozenset(excluded))  # fmt: skip
        verify_candidates(client, found, trust, say)
        return found

    found = look(refused)
    untrusted = {c.run_id: c for c in found if c.trust_problem}
    if not untrusted:
        return found
    try:
        again = look(refused | set(untrusted))
    except NgraphError:  # nothing but them
        return found
    if sum(not c.trust_problem for c in again) <= sum(not c.trust_problem for c in found):
        return found
    for run_id, c in untrusted.items():
        say(f"refused {c.label} (run {run_id}): {c.trust_problem}")
    refused.update(untrusted)
    return again


def _trusted_best(selection, what: str, trust):
    """The deployable candidates, best first (``select.best``), and where none is left
    because none is signed by a producer the user trusts, how to trust one.

    Raises:
        NgraphError: none is left."""
    from mlflow_ngraph.deploy.select import best

    if not selection.ranked and any(c.trust_problem for c in selection.excluded):
        first = next(c for c in selection.excluded if c.trust_problem)
        altered = any(
            word in first.trust_problem
            for word in ("the store was altered", "altered after signing", "copied here")
        )
        advice = "ask its producer to measure it again" if altered else trust.advice()
        raise NgraphError(
            f"no engine for {what} passed the signature check ({first.label}: "
            f"{first.trust_problem}): {advice}"
        )
    return best(selection, what)


def signature_env(trusted_keys: str | None, allow_unsigned: bool | None) -> dict[str, str]:
    """The settings that hand ``--trusted-keys`` and ``--allow-unsigned`` to a process this
    command starts."""
    from mlflow_ngraph.deploy.signed import ALLOW_UNSIGNED_ENV
    from mlflow_ngraph.keys import ENV_TRUSTED

    env = {ENV_TRUSTED: str(Path(trusted_keys).resolve())} if trusted_keys else {}
    if allow_unsigned is not None:
        env[ALLOW_UNSIGNED_ENV] = "1" if allow_unsigned else "0"
    return env


@click.command("pull")
@_selection_options
@click.option(
    "-o", "--output", "output", required=True, type=click.Path(path_type=Path), help="Directory."
)
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
@_sha256_option
def pull(output: Path, force: bool, sha256: str | None, **options) -> None:
    """Fetch the fastest verified engine of a device and model into a directory.

    Candidates come from the benchmarks' results indexes; FAILED and INVALID cells, identity
    and cells over the latency cap are set aside with the reason. The engine is downloaded,
    every file checked against its manifest (size, sha256), then moved into place.

    The chosen run must back its results-index record (params, metrics), and the manifest
    must be the one its run recorded when it logged the engine (or --sha256).
    """
    import json

    from mlflow_ngraph.deploy import trust
    from mlflow_ngraph.deploy.pull import SOURCE_FILE, check_target
    from mlflow_ngraph.deploy.pull import pull as do_pull

    check_target(output, force)
    with store_errors(options["tracking_uri"], options["experiment"], "READ"):
        client, _, chosen, run, _ = _choose(options)
        path = do_pull(client, chosen, output, force, sha256, run)
    source = json.loads((path / SOURCE_FILE).read_text())
    say(f"pulled and verified into {path}")
    say(f"manifest sha256 {source['manifest_sha256']} (pin it with --sha256)")
    manifest = json.loads((path / trust.MANIFEST).read_text())
    code = trust.runs_code(manifest)
    if code:
        say(
            f"note: this engine is {code}: it runs code when loaded, so run-engine, "
            f"load_engine and register need --trust-code (trust {source['created_by']} and "
            "every writer of the experiment first)"
        )


@click.command("run-engine")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--input", "input_file", type=click.Path(path_type=Path), help="A .npy input.")
@click.option("--repetitions", type=int, default=10, show_default=True, help="Timed calls.")
@_sha256_option
@_trust_option
@signature_options
def run_engine(
    directory: Path,
    input_file: Path | None,
    repetitions: int,
    sha256: str | None,
    trust_code: bool | None,
    trusted_keys: str | None,
    allow_unsigned: bool | None,
) -> None:
    """Run a pulled engine: output shape, a checksum and latency."""
    from mlflow_ngraph.deploy.engine import load_engine, timed_runs

    if repetitions < 1:
        raise NgraphError(f"--repetitions must be >= 1, got {repetitions}")
    engine = load_engine(
        directory,
        sha256=sha256,
        trust_code=trust_code,
        trusted_keys=trusted_keys,
        allow_unsigned=allow_unsigned,
    )
    try:
        if input_file is not None:
            try:
                x = np.load(input_file, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise NgraphError(f"{input_file} is not a readable .npy array ({exc})") from None
        else:
            rng = np.random.default_rng(0)
            x = rng.standard_normal(engine.input_shape).astype(engine.dtype)
        y = np.asarray(engine.predict(x))
        timing = timed_runs(engine, x, repetitions)
    finally:
        engine.close()
    digest = hashlib.sha256(np.ascontiguousarray(y, dtype=np.float32).tobytes()).hexdigest()
    say(f"engine: {engine.compiler} {engine.manifest.get('compiler_version', '')}")
    say(
        f"signed by {engine.signed.signer.name} (key {engine.signed.signer.short})"
        if engine.signed is not None
        else "UNSIGNED: no producer you trust signed this engine (--allow-unsigned)"
    )
    click.echo(f"input: {tuple(x.shape)} {x.dtype}  output: {tuple(y.shape)} {y.dtype}")
    click.echo(f"output sha256: {digest[:16]}  sum: {float(y.sum()):.6g}")
    click.echo(
        f"latency over {repetitions} call(s): mean {timing['mean_ms']:.3f} ms, "
        f"p50 {timing['p50_ms']:.3f} ms, p99 {timing['p99_ms']:.3f} ms "
        f"({timing['throughput']:.1f} samples/s)"
    )


@click.command("register")
@_selection_options
@click.option("--name", help="Registered model name (default <model>-<compiler>).")
@_sha256_option
@_trust_option
def register(name: str | None, sha256: str | None, trust_code: bool | None, **options) -> None:
    """Log the fastest verified engine as an MLflow model, register it and point the
    device's alias at it (when it is faster than the version the alias points at)."""
    from mlflow_ngraph.deploy.pull import download_verified
    from mlflow_ngraph.deploy.register import register as do_register
    from mlflow_ngraph.scratch import work_folder

    with store_errors(options["tracking_uri"], options["experiment"], "EDIT"):
        client, uri, chosen, run, selection = _choose(options)
        # removed however it ends; one a killed register left, by the next one
        with work_folder(None, "ngraph-register-") as tmp:
            local = download_verified(client, chosen, tmp, sha256, run)
            done = do_register(client, local, chosen, uri, selection.metric, name, trust_code)
    say(f"logged model {done.model_uri} (source run {chosen.run_id})")
    if done.reused:
        say(
            f"{done.name} version {done.version} holds this engine of this run already: "
            "no new version"
        )
    else:
        say(f"registered {done.name} version {done.version}")
    where = "now points at it" if done.alias_moved else f"stays on version {done.alias_version}"
    say(f"alias {done.alias!r} {where}: models:/{done.name}@{done.alias}")


@click.command("serve")
@click.argument("model_uri")
@click.option("-h", "--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("-p", "--port", type=int, default=5001, show_default=True, help="Port.")
@click.option("--tracking-uri", help="Default: MLFLOW_TRACKING_URI, then MLflow's.")
@_trust_option
@signature_options
def serve(
    model_uri: str,
    host: str,
    port: int,
    tracking_uri: str | None,
    trust_code,
    trusted_keys: str | None,
    allow_unsigned: bool | None,
) -> None:
    """Serve a registered engine (models:/NAME@ALIAS) with MLflow's scoring server, after
    checking its MLmodel and engine files against the registered version's manifest_sha256:
    what runs is the installed loader, never code from the store. A request of another
    shape than the engine's (its batch size) gets HTTP 400 with a one-line message."""
    import os
    import sys

    from mlflow.pyfunc.scoring_server import _SERVER_MODEL_PATH as SERVER_MODEL_PATH
    from mlflow.tracking import MlflowClient

    from mlflow_ngraph.deploy.registered import fetch_registered, registered_name
    from mlflow_ngraph.deploy.trust import TRUST_ENV, trusted
    from mlflow_ngraph.scratch import work_folder
    from mlflow_ngraph.tracking.mlflow_log import resolve_tracking_uri
    from mlflow_ngraph.tracking.uri import check_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    check_tracking_uri(uri)
    # the checked copy: removed when the server ends; one a killed serve left, by the next
    with work_folder(None, "ngraph-serve-") as tmp:
        with store_errors(uri, registered_name(model_uri), "READ", on="registered model"):
            local, version = fetch_registered(
                MlflowClient(uri), model_uri, tmp, trusted_keys, allow_unsigned
            )
        say(f"serving {version.name} version {version.version}, checked, from {local}")
        env = {**os.environ, TRUST_ENV: "1" if trusted(trust_code) else "0"}
        # the server's load checks the signature as this command did
        env.update(signature_env(trusted_keys, allow_unsigned))
        # what `mlflow models serve --env-manager local` runs, with one-line refusals
        env[SERVER_MODEL_PATH] = str(local)
        app = "mlflow_ngraph.deploy.serving:create_app"
        command = [sys.executable, "-m", "uvicorn", "--factory", app, "--host", host]
        _run_server([*command, "--port", str(port)], env)


def _run_server(command: list[str], env: dict[str, str]) -> None:
    """The scoring server, until it ends; SIGTERM or Ctrl-C here ends it too (and the
    caller's checked copy is removed).

    Raises:
        NgraphError: it ended with a failure status."""
    import signal
    import subprocess

    process = subprocess.Popen(command, env=env)
    previous = signal.signal(signal.SIGTERM, lambda *_: process.terminate())
    try:
        code = process.wait()
    except KeyboardInterrupt:
        process.terminate()
        code = process.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code and code != -signal.SIGTERM:
        raise NgraphError(f"the scoring server ended with status {code}")


__all__ = ["pull", "run_engine", "register", "serve"]
