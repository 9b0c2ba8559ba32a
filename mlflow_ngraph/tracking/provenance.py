"""Signed records: what a producer measured, signed where it measured it.

When a result is logged, the producer writes a record of it (the run and batch size, the
model and its params, the compiler and flags, the device and host, the figures and their
intervals, the stability verdict, the output check, the versions, and the sha256 of the
engine's manifest, which pins every engine file by size and sha256) and signs it with its
private key (:mod:`mlflow_ngraph.keys`) through OpenSSF model-signing: a Sigstore bundle
holding a DSSE envelope over an in-toto statement of the record's sha256. Both go to the
cell run as ``ngraph/signed/bs<b>.json`` and ``bs<b>.sig``.

A reader trusts a record only when its signature verifies against a key it holds, and the
record names the run and batch size it is read for (a record copied onto another run or
batch size is refused). What the store says beside it (metrics, tags, new params, the
results index) is for display: a figure that differs from the signed one is tampering.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.keys import PublicKey, public_of
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tracking.mlflow_log import param_value

log = logging.getLogger(__name__)

SIGNED_DIR = "ngraph/signed"
#: a pulled engine folder's copy of its signed record and signature
LOCAL_RECORD = "provenance.json"
LOCAL_SIGNATURE = "provenance.sig"
RECORD_VERSION = 1
#: the largest record or signature read back (a record is a few kB)
MAX_BYTES = 1 << 20
#: the environment tags a record carries (where, on what, with which versions)
ENV_TAGS = (S.T_DEVICE, "ngraph.device_profile", S.T_DEVICE_KIND, S.T_HOST,
            "ngraph.device_fingerprint", S.T_SPEC_HASH)  # fmt: skip


def record_artifact(b: int) -> str:
    return f"{SIGNED_DIR}/bs{b}.json"


def signature_artifact(b: int) -> str:
    return f"{SIGNED_DIR}/bs{b}.sig"


def _figures(metrics: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    }


def _manifest_sha256(record: dict[str, Any]) -> str | None:
    from mlflow_ngraph.tracking.engines import MANIFEST, file_sha256, read_manifest

    folder = record.get("engine_dir")
    if not folder or not (Path(folder) / MANIFEST).is_file():
        return None
    manifest = read_manifest(Path(folder))
    return file_sha256(Path(folder) / MANIFEST) if manifest and manifest.get("files") else None


def build_record(
    run_id: str,
    experiment_id: str,
    b: int,
    record: dict[str, Any],
    description: dict[str, Any],
    signer: PublicKey,
    manifest_sha256: str | None = None,
) -> dict[str, Any]:
    """The record a producer signs for one result (``record``: the journal's result;
    ``description``: the journal's params and tags of its cell)."""
    tags = description.get("tags") or {}
    stability = record.get("stability") or {}
    return {
        "record_version": RECORD_VERSION,
        "run_id": run_id,
        "experiment_id": str(experiment_id),
        "batch_size": int(b),
        "params": {k: param_value(v) for k, v in (description.get("params") or {}).items()},
        "environment": {
            **{k: str(tags[k]) for k in ENV_TAGS if tags.get(k) is not None},
            **{k: str(v) for k, v in tags.items() if k.startswith("ngraph.version.")},
        },
        "status": record.get("status"),
        "metrics": _figures(record.get("metrics") or {}),
        "stability": (S.STABILITY_STABLE if stability.get("stable") else S.STABILITY_UNSTABLE)
        if stability
        else "",
        "engine_manifest_sha256": manifest_sha256
        or (_manifest_sha256(record) if record.get("engine_dir") else None),
        "signer": {"name": signer.name, "fingerprint": signer.fingerprint},
        "signed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


class Producer:
    """Signs results with one private key (``keys.ensure_key`` made it)."""

    def __init__(self, private: Path) -> None:
        # model-signing's import (about 0.3 s of a core) here, before any measuring, not at
        # the first result, while the next engine is measured beside this process
        import model_signing.signing  # noqa: F401

        self.private = Path(private)
        self.public = public_of(self.private)

    def sign_file(self, path: Path, signature: Path) -> None:
        """A model-signing bundle of ``path`` into ``signature``."""
        from model_signing import signing

        signing.Config().use_elliptic_key_signer(private_key=self.private).sign(path, signature)

    def sign(
        self,
        client,
        run_id: str,
        experiment_id: str,
        b: int,
        record: dict[str, Any],
        description: dict[str, Any],
        manifest_sha256: str | None = None,
    ) -> None:
        """The result's signed record, logged to its run (replacing an earlier one of the
        batch size, as a settled re-run interval does); ``manifest_sha256``: its engine's,
        where the record's engine folder is not at hand."""
        signed = build_record(
            run_id, experiment_id, b, record, description, self.public, manifest_sha256
        )
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"bs{b}.json"
            path.write_text(json.dumps(signed, indent=1, sort_keys=True))
            self.sign_file(path, Path(tmp) / f"bs{b}.sig")
            client.log_artifacts(run_id, tmp, artifact_path=SIGNED_DIR)


@dataclass(frozen=True)
class Signed:
    """A verified record and the trusted key that signed it."""

    record: dict[str, Any]
    signer: PublicKey
    raw: bytes = b""  # the record's file, as signed
    signature: bytes = b""  # its model-signing bundle

    def write(self, folder: Path) -> None:
        """The record and its signature into ``folder`` (:data:`LOCAL_RECORD`,
        :data:`LOCAL_SIGNATURE`), for a later check of the folder (``load_engine``)."""
        (Path(folder) / LOCAL_RECORD).write_bytes(self.raw)
        (Path(folder) / LOCAL_SIGNATURE).write_bytes(self.signature)

    @property
    def metrics(self) -> dict[str, float]:
        return self.record.get("metrics") or {}


def signature_hint(signature: Path) -> str:
    """The fingerprint of the key a model-signing bundle says made it ("" if none)."""
    try:
        bundle = json.loads(Path(signature).read_text())
        return str(bundle["verificationMaterial"]["publicKey"]["hint"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def verify_files(
    record_file: Path,
    signature: Path,
    trusted: dict[str, PublicKey],
    run_id: str | None,
    b: int | None,
) -> Signed:
    """The record in ``record_file``, once its signature verifies against a trusted key and
    it names ``run_id`` and batch size ``b``.

    Raises:
        NgraphError: why it is not trusted (one clause, no trailing advice).
    """
    for path in (record_file, signature):
        if not path.is_file():
            raise NgraphError(
                "it is not signed (measured before results were signed, or planted; whoever "
                "measured it signs it with 'mlflow-ngraph keys resign -e EXPERIMENT')"
            )
        if path.stat().st_size > MAX_BYTES:
            raise NgraphError(f"its signed record is over {MAX_BYTES} bytes")
    key = _signer(record_file, signature, trusted)
    raw = record_file.read_bytes()
    record = json.loads(raw)
    if run_id is None:  # a local folder's own record: it names its run
        run_id, b = record.get("run_id"), record.get("batch_size")
    if record.get("run_id") != run_id or record.get("batch_size") != b:
        raise NgraphError(
            f"its signed record is {key.name}'s for run {record.get('run_id')} batch size "
            f"{record.get('batch_size')}, not this one (copied here)"
        )
    return Signed(record, key, raw, signature.read_bytes())


def _signer(record_file: Path, signature: Path, trusted: dict[str, PublicKey]) -> PublicKey:
    """The trusted key whose model-signing signature of ``record_file`` verifies.

    Raises:
        NgraphError: the key named is not trusted, or its signature does not verify."""
    from model_signing import verifying

    hint = signature_hint(signature)
    key = trusted.get(hint)
    if key is None:
        claim = _claimed_signer(record_file)
        raise NgraphError(
            f"it is signed by key {hint[:16] or '(unnamed)'}"
            f"{f' (the record says {claim!r})' if claim else ''}, not one you trust"
        )
    with tempfile.TemporaryDirectory() as tmp:
        pem = Path(tmp) / "key.pub"
        pem.write_bytes(key.pem)
        try:
            verifying.Config().use_elliptic_key_verifier(public_key=pem).verify(
                record_file, signature
            )
        except Exception as exc:  # model-signing raises ValueError, protobuf and JSON errors
            log.debug("signature of %s: %s", record_file, exc)
            raise NgraphError(
                f"its signed record does not match {key.name}'s signature (altered after signing)"
            ) from None
    return key


def _claimed_signer(record_file: Path) -> str:
    """The signer's name a record claims (not verified: for the refusal only)."""
    try:
        return str(json.loads(record_file.read_text())["signer"]["name"])[:80]
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def fetch_signed(client, run_id: str, b: int, trusted: dict[str, PublicKey], into: Path) -> Signed:
    """Download and verify the signed record of (run, batch size) into ``into``.

    Raises:
        NgraphError: why it is not trusted."""
    from mlflow.exceptions import MlflowException

    into.mkdir(parents=True, exist_ok=True)
    try:  # sizes first: nothing over the cap is downloaded
        listed = {f.path: f.file_size for f in client.list_artifacts(run_id, SIGNED_DIR)}
    except (MlflowException, OSError):
        listed = {}
    got = {}
    for name in (record_artifact(b), signature_artifact(b)):
        size = listed.get(name)
        if size is not None and size > MAX_BYTES:
            raise NgraphError(f"its signed record is over {MAX_BYTES} bytes")
        try:
            got[name] = Path(client.download_artifacts(run_id, name, str(into)))
        except (MlflowException, OSError):
            got[name] = into / "missing" / name
    return verify_files(got[record_artifact(b)], got[signature_artifact(b)], trusted, run_id, b)


def producer(home: Path) -> Producer | None:
    """This home's producer (its key pair made on first use), or None, said once, when no
    key can be made or read: the results are logged unsigned."""
    from mlflow_ngraph.keys import ensure_key

    try:
        return Producer(ensure_key(Path(home)))
    except (NgraphError, OSError) as exc:
        log.warning("results are logged unsigned: no signing key (%s)", exc)
        return None
