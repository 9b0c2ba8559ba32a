"""Which candidates a trusted producer signed, and the figures they are ranked on.

Every candidate's signed record (:mod:`mlflow_ngraph.tracking.provenance`) is fetched and
verified against the user's trusted producers (:mod:`mlflow_ngraph.keys`). A verified one
is ranked on its signed figures and stability; where the store's figures differ, the store
was altered, and each difference is said. A candidate whose record is missing, signed by a
key the user does not trust, altered, or signed for another run or batch size is set aside
with the reason, unless the user allows unsigned engines, and then it is said on every line
that shows it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mlflow_ngraph.deploy.select import KEPT_METRICS, Candidate, model_label
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.keys import PublicKey
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tracking.provenance import Signed, fetch_signed

#: parallel record downloads (I/O bound, as the results index's)
THREADS = 8
#: the flag of the commands that verify, and its setting
ALLOW_UNSIGNED_ENV = "MLFLOW_NGRAPH_ALLOW_UNSIGNED"


@dataclass(frozen=True)
class Trust:
    """Whose signatures a command accepts (by fingerprint) and whether it takes unsigned
    engines; ``source``: the trusted-producers file, named in refusals."""

    keys: dict[str, PublicKey]
    allow_unsigned: bool
    source: Path

    @classmethod
    def of(cls, trusted_keys: str | None, allow_unsigned: bool | None) -> Trust:
        """The trust of the user running the command (their home's key and file, or
        ``--trusted-keys``)."""
        import os

        from mlflow_ngraph import keys
        from mlflow_ngraph.console import default_home

        home = default_home()
        if allow_unsigned is None:
            allow_unsigned = os.environ.get(ALLOW_UNSIGNED_ENV, "").lower() in ("1", "true", "yes")
        found = keys.trusted_path(home, trusted_keys)
        if trusted_keys and not found.is_file():
            raise NgraphError(f"--trusted-keys {found}: no such file")
        return cls(keys.trusted_keys(home, trusted_keys), bool(allow_unsigned), found)

    def advice(self) -> str:
        """How to trust a producer, or to go on without (the end of a refusal)."""
        return (
            "if you trust whoever measured it, add their public key ('mlflow-ngraph keys "
            f"add KEY', into {self.source}); or pass --allow-unsigned"
        )


def identity(signed: Signed) -> dict[str, str]:
    """The cell a signed record is of, as a candidate names it."""
    params = signed.record.get("params") or {}

    def joined(prefix: str) -> str:
        items = sorted((k[len(prefix) :], v) for k, v in params.items() if k.startswith(prefix))
        return ",".join(f"{k}={v}" for k, v in items)

    model = params.get(S.P_MODEL, "")
    model_params = joined(S.P_MODEL_PARAM_PREFIX)
    return {
        "device": params.get(S.P_DEVICE, ""),
        "model": model_label(f"{model}:{model_params}" if model_params else model),
        "compiler": params.get(S.P_COMPILER, ""),
        "flags": joined(S.P_FLAG_PREFIX),
    }


def _fetch(client, key: tuple[str, int], folder: Path, keys: dict) -> Signed | NgraphError:
    run_id, b = key
    try:
        return fetch_signed(client, run_id, b, keys, folder / f"{run_id}-bs{b}")
    except NgraphError as exc:
        return exc


def _fetch_all(client, pairs: set[tuple[str, int]], trust: Trust) -> dict:
    """(run, batch size) -> its verified record, or why it is not trusted; fetched
    :data:`THREADS` at a time into a work folder removed however it ends."""
    from mlflow_ngraph.scratch import work_folder

    ordered = sorted(pairs)
    with work_folder(None, "ngraph-signed-") as folder, ThreadPoolExecutor(THREADS) as pool:
        fetched = pool.map(lambda p: _fetch(client, p, folder, trust.keys), ordered)
        return dict(zip(ordered, fetched))


def verify_candidates(client, found: list[Candidate], trust: Trust, say: Callable) -> None:
    """Each candidate's signed record, verified; a verified candidate takes its signed
    figures, any other is set aside (``trust_problem``) or, allowed, marked unsigned."""
    results = _fetch_all(client, {(c.run_id, c.batch_size) for c in found if c.batch_size}, trust)
    for c in found:
        got = results.get((c.run_id, c.batch_size))
        if isinstance(got, Signed):
            adopt(c, got, say)
        elif got is not None and trust.allow_unsigned:
            c.unsigned = str(got)
        elif got is not None:
            c.trust_problem = f"not signed by a producer you trust: {got}"


def adopt(c: Candidate, signed: Signed, say: Callable) -> None:
    """The candidate as its signed record has it: its cell checked, its figures and
    stability the signed ones; each store figure that differs is said (tampering)."""
    who = signed.signer.name
    cell = identity(signed)
    ours = {"device": c.device, "model": model_label(c.model), "compiler": c.compiler,
            "flags": c.flags}  # fmt: skip
    for what, value in ours.items():
        if value != cell[what]:
            c.trust_problem = (
                f"the store says {what} {value!r}, {who} signed {cell[what]!r}: the store was "
                "altered"
            )
            return
    figures = signed.metrics
    changed = [
        f"{name} {c.metrics[name]:.6g} (signed {figures[name]:.6g})"
        for name in sorted(KEPT_METRICS)
        if name in c.metrics
        and name in figures
        and not math.isclose(c.metrics[name], figures[name], rel_tol=1e-9, abs_tol=1e-12)
    ]
    changed += [f"{name} (signed: none)" for name in sorted(KEPT_METRICS - set(figures))
                if name in c.metrics]  # fmt: skip
    if changed:
        say(
            f"tampering: the store's figures of {c.label} (run {c.run_id}) differ from what "
            f"{who} signed: {'; '.join(changed)}: ranked on the signed ones"
        )
    c.metrics = {k: v for k, v in figures.items() if k in KEPT_METRICS}
    c.stability = str(signed.record.get("stability") or "")
    c.status = str(signed.record.get("status") or c.status)
    c.signer = who
    c.signed = signed


def verified_cells(client, raw, trust: Trust):
    """``compare --verified``: the rows of ``raw`` (compare's frame, a row per cell run and
    batch size) that a trusted producer signed, their figures and stability the signed
    ones; returns (that frame, notes on what was left out or found altered)."""
    rows = raw.reset_index(drop=True)
    keys = [
        (str(r), int(b)) if b == b else None for r, b in zip(rows["run_id"], rows["batch_size"])
    ]
    results = _fetch_all(client, {k for k in keys if k is not None}, trust)
    keep, altered = [], 0
    for i, key in enumerate(keys):
        got = results.get(key) if key is not None else None
        if not isinstance(got, Signed) or _cell_differs(rows.iloc[i], got):
            continue
        keep.append(i)
        for name, value in got.metrics.items():
            if name in rows.columns:
                held = rows.at[i, name]
                altered += held == held and not math.isclose(float(held), value, rel_tol=1e-9)
                rows.at[i, name] = value
        if "stability" in rows.columns:
            rows.at[i, "stability"] = str(got.record.get("stability") or "")
    notes = []
    if len(keep) < len(rows):
        notes.append(
            f"--verified: {len(rows) - len(keep)} of {len(rows)} result(s) left out: no producer "
            f"you trust signed them ({trust.source}; 'mlflow-ngraph keys add' to trust one)"
        )
    if altered:
        notes.append(
            f"--verified: {altered} figure(s) in the store differ from the signed ones "
            "(the store was altered): the signed ones are shown"
        )
    return rows.iloc[keep].reset_index(drop=True), notes


def _cell_differs(row, signed: Signed) -> bool:
    """Whether compare's row names another cell than the signed record (relabelled)."""
    cell = identity(signed)
    model = row.get("model")
    label = model_label(f"{model}:{row.get('model_params')}" if row.get("model_params") else model)
    return (row.get("compiler"), label, row.get("flags") or "") != (
        cell["compiler"],
        cell["model"],
        cell["flags"],
    )
