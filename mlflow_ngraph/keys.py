"""The producer's key pair and the producers a user trusts.

A writer of a shared experiment can change its metrics, tags, new params and artifacts, so
nothing in the store proves who measured an engine. A producer signs what it measured with a
private key that never leaves its home (``keys/producer.pem``, made on first use, like
``ssh-keygen``); a user trusts a producer by holding its public key in a trusted-producers
file. A public key travels as one line, as an SSH public key does::

    ngraph-ecdsa-p256 MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE... alice@gpu-box

A key's fingerprint is the sha256 of its PEM form, the ``hint`` OpenSSF model-signing writes
into every signature it makes with it, so a signature names the key that made it.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from mlflow_ngraph.errors import NgraphError

log = logging.getLogger(__name__)

#: the private key to sign with instead of the home's (a cluster's nodes can share one)
ENV_SIGNING_KEY = "MLFLOW_NGRAPH_SIGNING_KEY"
#: a trusted-producers file to use instead of the home's (a team's shared one)
ENV_TRUSTED = "MLFLOW_NGRAPH_TRUSTED_KEYS"
#: a public key line's first word
KIND = "ngraph-ecdsa-p256"
PRIVATE_FILE = "producer.pem"
TRUSTED_FILE = "trusted_producers"


@dataclass(frozen=True)
class PublicKey:
    """A producer's public key (PEM, SubjectPublicKeyInfo) and the name it goes by."""

    name: str
    pem: bytes

    @property
    def fingerprint(self) -> str:
        """The sha256 of the PEM form (what a model-signing bundle's ``hint`` holds)."""
        return hashlib.sha256(self.pem).hexdigest()

    @property
    def short(self) -> str:
        return self.fingerprint[:16]

    def line(self) -> str:
        """The key as one shareable line (``KIND base64(DER) name``)."""
        from cryptography.hazmat.primitives import serialization

        key = serialization.load_pem_public_key(self.pem)
        der = key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return f"{KIND} {base64.b64encode(der).decode()} {self.name}"


def default_name() -> str:
    """``user@host``: the name a new key pair goes by."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "user"
    return f"{user}@{socket.gethostname()}"


def parse_line(line: str, where: str = "the key") -> PublicKey:
    """A public key from its one-line form.

    Raises:
        NgraphError: not a line of this form, or not a P-256 public key.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    parts = line.strip().split(None, 2)
    if len(parts) < 2 or parts[0] != KIND:
        raise NgraphError(
            f"{where} is not a public key line ('{KIND} <base64> <name>', as "
            "'mlflow-ngraph keys export' prints it)"
        )
    try:
        key = serialization.load_der_public_key(base64.b64decode(parts[1], validate=True))
    except ValueError:
        raise NgraphError(f"{where}: its base64 is not a public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise NgraphError(f"{where}: not an ECDSA P-256 public key")
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    name = parts[2].strip() if len(parts) > 2 else hashlib.sha256(pem).hexdigest()[:16]
    return PublicKey(name, pem)


def read_trusted(path: Path) -> list[PublicKey]:
    """The keys of a trusted-producers file (one key line each; ``#`` starts a comment).

    Raises:
        NgraphError: a line that is not a key (naming the file and line)."""
    path = Path(path)
    if not path.is_file():
        return []
    keys = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            keys.append(parse_line(line, f"{path} line {number}"))
    return keys


def key_dir(home: Path) -> Path:
    return Path(home) / "keys"


def trusted_path(home: Path, given: str | Path | None = None) -> Path:
    """The trusted-producers file: ``given`` (``--trusted-keys``), else
    :data:`ENV_TRUSTED`, else the home's."""
    chosen = given or os.environ.get(ENV_TRUSTED)
    return Path(chosen).expanduser() if chosen else key_dir(home) / TRUSTED_FILE


def private_path(home: Path) -> Path:
    """The private key this home signs with (:data:`ENV_SIGNING_KEY` when set)."""
    chosen = os.environ.get(ENV_SIGNING_KEY)
    return Path(chosen).expanduser() if chosen else key_dir(home) / PRIVATE_FILE


def own_key(home: Path) -> PublicKey | None:
    """The public half of this home's signing key, or None before the first one is made."""
    path = private_path(home)
    return public_of(path) if path.is_file() else None


def public_of(private: Path, name: str | None = None) -> PublicKey:
    """The public key of a private key file (its name: the comment beside it, else
    :func:`default_name`).

    Raises:
        NgraphError: not a readable, unencrypted EC P-256 private key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        key = serialization.load_pem_private_key(Path(private).read_bytes(), None)
    except (OSError, ValueError, TypeError) as exc:
        raise NgraphError(f"{private} is not a usable signing key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise NgraphError(f"{private} is not an ECDSA P-256 private key")
    pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if name is None:
        name_file = Path(private).with_suffix(".name")
        name = name_file.read_text().strip() if name_file.is_file() else default_name()
    return PublicKey(name, pem)


def ensure_key(home: Path, name: str | None = None) -> Path:
    """This home's private key, made on first use (P-256, owner-only, its public key added
    to the home's trusted producers and printed with how to share it)."""
    path = private_path(home)
    if path.is_file():
        return path
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    path.with_suffix(".name").write_text((name or default_name()) + "\n")
    try:
        os.link(tmp, path)  # a second process making one at the same time keeps the first
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    public = public_of(path)
    add_trusted(key_dir(home) / TRUSTED_FILE, public)
    log.info(
        "made a signing key pair in %s; results this home measures are signed with it. "
        "Your public key (share it; a colleague trusts it with 'mlflow-ngraph keys add'):\n%s",
        path.parent,
        public.line(),
    )
    return path


def add_trusted(path: Path, key: PublicKey) -> bool:
    """Add ``key`` to a trusted-producers file; False when it is there already.

    Raises:
        NgraphError: another key of that name is there."""
    path = Path(path)
    held = read_trusted(path)
    if any(k.fingerprint == key.fingerprint for k in held):
        return False
    if any(k.name == key.name for k in held):
        raise NgraphError(
            f"{path} trusts another key named {key.name!r}: remove it first "
            f"('mlflow-ngraph keys remove {key.name}') or name this one otherwise"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(key.line() + "\n")
    return True


def remove_trusted(path: Path, which: str) -> PublicKey:
    """Remove the key named ``which`` (or whose fingerprint starts with it).

    Raises:
        NgraphError: no such key in the file."""
    path = Path(path)
    held = read_trusted(path)
    gone = [
        k for k in held if k.name == which or (len(which) >= 8 and k.fingerprint.startswith(which))
    ]
    if not gone:
        raise NgraphError(f"{path} holds no key named {which!r}: 'mlflow-ngraph keys list'")
    kept = [k for k in held if k not in gone]
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text("".join(k.line() + "\n" for k in kept))
    os.replace(tmp, path)
    return gone[0]


def trusted_keys(home: Path, given: str | Path | None = None) -> dict[str, PublicKey]:
    """The keys a record may be signed with, by fingerprint: the trusted-producers file's
    and this home's own."""
    keys = {k.fingerprint: k for k in read_trusted(trusted_path(home, given))}
    own = own_key(home)
    if own is not None:
        keys.setdefault(own.fingerprint, own)
    return keys
