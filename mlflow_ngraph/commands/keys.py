"""``mlflow-ngraph keys``: this home's signing key and the producers it trusts."""

from __future__ import annotations

from pathlib import Path

import click

from mlflow_ngraph.commands.deploy import trusted_keys_option
from mlflow_ngraph.errors import NgraphError

_trusted_option = trusted_keys_option(
    "The trusted-producers file to read or change (default: your home's, or "
    "MLFLOW_NGRAPH_TRUSTED_KEYS)."
)


@click.group("keys")
def keys_command() -> None:
    """This home's signing key and the producers whose results you trust.

    Every result a benchmark logs is signed with this home's key (made on first use);
    pull, register, serve and load_engine deploy only what a trusted producer signed.
    A colleague trusts you with the line 'keys export' prints: 'keys add LINE'.
    """


@keys_command.command("list")
@_trusted_option
def list_keys(trusted_keys: str | None) -> None:
    """Your key and the trusted producers (name, fingerprint)."""
    from mlflow_ngraph import keys
    from mlflow_ngraph.console import default_home
    from mlflow_ngraph.table import format_table

    home = default_home()
    own = keys.own_key(home)
    path = keys.trusted_path(home, trusted_keys)
    if trusted_keys and not path.is_file():
        raise NgraphError(f"--trusted-keys {path}: no such file")
    rows = [[k.name, k.short, "yes" if own and own == k else ""] for k in keys.read_trusted(path)]
    if own is not None and not any(r[2] for r in rows):
        rows.insert(0, [own.name, own.short, "yes (trusted as your own)"])
    click.echo(f"your signing key: {keys.private_path(home) if own else '(none yet)'}")
    click.echo(f"trusted producers ({path}):")
    click.echo(format_table(["name", "fingerprint", "yours"], rows) if rows else "  none")


@keys_command.command("export")
def export_key() -> None:
    """Print your public key as one line (made now if there is none yet)."""
    from mlflow_ngraph import keys
    from mlflow_ngraph.console import default_home

    home = default_home()
    click.echo(keys.public_of(keys.ensure_key(home)).line())


@keys_command.command("add")
@click.argument("key")
@click.option("--name", help="The name to trust it by (default: the name in the line).")
@_trusted_option
def add_key(key: str, name: str | None, trusted_keys: str | None) -> None:
    """Trust a producer: KEY is the line 'keys export' printed on their machine, or a file
    holding it."""
    from mlflow_ngraph import keys
    from mlflow_ngraph.console import default_home

    text = key
    if Path(key).is_file():
        text = Path(key).read_text().strip().splitlines()[0] if Path(key).read_text() else ""
    public = keys.parse_line(text)
    if name:
        public = keys.PublicKey(name, public.pem)
    path = keys.trusted_path(default_home(), trusted_keys)
    if keys.add_trusted(path, public):
        click.echo(f"trusting {public.name} (key {public.short}) in {path}")
    else:
        click.echo(f"{path} trusts key {public.short} already")


@keys_command.command("remove")
@click.argument("name")
@_trusted_option
def remove_key(name: str, trusted_keys: str | None) -> None:
    """Stop trusting a producer (by name, or a fingerprint's first 8+ hex digits): their
    engines are refused from now on."""
    from mlflow_ngraph import keys
    from mlflow_ngraph.console import default_home

    path = keys.trusted_path(default_home(), trusted_keys)
    gone = keys.remove_trusted(path, name)
    click.echo(f"no longer trusting {gone.name} (key {gone.short}) in {path}")


@keys_command.command("resign")
@click.option("-e", "--experiment", required=True, help="Experiment name or id.")
@click.option("--tracking-uri", help="Default: MLFLOW_TRACKING_URI, then MLflow's.")
def resign(experiment: str, tracking_uri: str | None) -> None:
    """Sign the results this home measured in EXPERIMENT before results were signed.

    Only results this home's journals hold as measured here are signed, with the journal's
    figures, and an engine only while the store's manifest is the one its run pinned.
    """
    import os

    from mlflow_ngraph.cluster.sync import journals_of
    from mlflow_ngraph.commands.deploy import experiment_ids, store_errors
    from mlflow_ngraph.console import default_home
    from mlflow_ngraph.tracking.journal import Journal
    from mlflow_ngraph.tracking.mlflow_log import connect, resolve_tracking_uri
    from mlflow_ngraph.tracking.provenance import producer
    from mlflow_ngraph.tracking.resign import Resigned, resign_journal

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    home = default_home()
    uri = resolve_tracking_uri(tracking_uri)
    signer = producer(home)
    if signer is None:
        raise NgraphError(f"no signing key in {home}: see the warning above")
    total = Resigned()
    with store_errors(uri, experiment, "EDIT"):
        client = connect(uri)
        ids = experiment_ids(client, experiment)
        if not ids:
            raise NgraphError(f"no experiment {experiment!r} in this store")
        for path in journals_of(home, uri):
            journal = Journal(path)
            if str((journal.store or {}).get("experiment_id")) in ids:
                done = resign_journal(client, journal, next(iter(ids)), signer)
                total.signed += done.signed
                total.skipped += done.skipped
    for why in total.skipped[:20]:
        click.echo(f"not signed: {why}")
    click.echo(
        f"signed {total.signed} result(s) of experiment {experiment!r} as {signer.public.name} "
        f"(key {signer.public.short}); {len(total.skipped)} left unsigned"
    )
    if not total.signed and not total.skipped:
        raise NgraphError(
            f"this home ({home}) measured nothing in experiment {experiment!r}: only the home "
            "that measured a result can sign it"
        )
