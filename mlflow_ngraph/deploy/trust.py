"""What an engine from a shared store must prove before this tool loads or deploys it.

The threat (docs/security.md): anyone with EDIT on an experiment can rewrite its artifacts,
so an engine folder, its ``manifest.json`` and a results index prove nothing by themselves.
What a store writer cannot change is a run's params (MLflow params are write-once), so:

- the run's params decide the loader: the manifest's compiler, flags and format must be the
  ones the cell run recorded (:func:`check_against_run`);
- the manifest's own sha256 is a param of the cell run, logged with the engine
  (:func:`engine_param`); ``pull`` checks the manifest against it, or against a hash pinned
  by hand (``--sha256``);
- a manifest names only files inside its folder, the file the loader reads among them, and
  the version and host fields the host checks need (:func:`check_manifest`);
- an engine whose loading runs code (TVM libraries, TorchScript, AOTInductor packages,
  TensorRT plans, ONNX Runtime with its TensorRT provider's engine cache) loads only with an
  explicit trust (:func:`check_code`). What runs is what the loader runs: the compiler that
  loads the engine says it of the manifest's format *and* flags (``Compiler.runs_code``),
  the flags resolved as the loader resolves them (:func:`loader_flags`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.tracking.engines import (  # noqa: F401 - what deploy checks, by these names
    MANIFEST,
    engine_param,
    file_sha256,
)

#: the setting that trusts executable engine formats (as ``--trust-code`` does)
TRUST_ENV = "MLFLOW_NGRAPH_TRUST_CODE"
#: fields without which the host checks cannot be made
HOST_FIELDS = ("compiler_version", "host_cpu", "cpu_flags")
#: the most files, and bytes in all, an engine's manifest may list; the most bytes the
#: manifest itself may have (checked against the store's listing before it is downloaded)
MAX_FILES = 10_000
MAX_ENGINE_BYTES = 64 * 2**30
MAX_MANIFEST_BYTES = 16 * 2**20


@dataclass(frozen=True)
class Format:
    compiler: str
    loads: tuple[str, ...]  # files the compiler's loader reads
    code: str = ""  # what runs when it is loaded ("" for a data format)


def engine_format(name: str | None) -> Format | None:
    """The engine format ``name`` as the compiler that writes it declares it
    (``Compiler.engine_formats``), or None: a format no installed compiler declares."""
    from mlflow_ngraph.compilers.registry import compiler_names, declared

    for compiler in compiler_names():
        found = declared(compiler)
        if found is not None and name in found.engine_formats:
            loads, code = found.engine_formats[name]
            return Format(compiler, tuple(loads), code)
    return None


def loader_flags(compiler, manifest: dict[str, Any]) -> dict[str, Any]:
    """The flags ``compiler``'s loader loads the engine of ``manifest`` with: the manifest's,
    resolved against the compiler's flags (deploy/engine.py loads with exactly these).

    Raises:
        NgraphError: a flag the compiler does not have, or a value it does not take."""
    flags = manifest.get("flags")
    if flags is not None and not isinstance(flags, dict):
        raise NgraphError("the engine's manifest has no flags: refusing it")
    return compiler.resolve_flags({k: v for k, v in (flags or {}).items() if v is not None})


def _loader(manifest: dict[str, Any]):
    """The installed compiler that loads the engine of ``manifest`` (its ``compiler``, else
    the one declaring its format), or None."""
    from mlflow_ngraph.compilers.registry import declared

    fmt = engine_format(manifest.get("format"))
    name = manifest.get("compiler") or (fmt.compiler if fmt is not None else None)
    return declared(name) if isinstance(name, str) else None


def runs_code(manifest: dict[str, Any]) -> str:
    """What runs on this machine when the engine of ``manifest`` is loaded, "" for data
    only: what the compiler that loads it declares of its format and flags
    (``Compiler.runs_code``); an engine no installed compiler declares counts as code.

    Raises:
        NgraphError: flags its compiler does not take (its loader would not load it)."""
    compiler, name = _loader(manifest), manifest.get("format")
    if compiler is None or name not in compiler.engine_formats:
        return (
            f"in a format no installed compiler declares ({name!r}: what loading runs is unknown)"
        )
    return compiler.runs_code(name, loader_flags(compiler, manifest))


def trusted(trust_code: bool | None) -> bool:
    """``trust_code`` when given, else the setting :data:`TRUST_ENV`."""
    if trust_code is not None:
        return bool(trust_code)
    return os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def check_pin(actual: str, expected: str, what: str) -> None:
    """Raises when the manifest's sha256 is not the one expected (``what`` says whose)."""
    expected = expected.strip().lower()
    if len(expected) < 12 or not all(c in "0123456789abcdef" for c in expected):
        raise NgraphError(f"{what} {expected!r} is not a sha256 (64 hex digits, or 12+ of them)")
    if not actual.startswith(expected):
        raise NgraphError(
            f"the engine's manifest has sha256 {actual[:16]}..., {what} is {expected[:16]}...: "
            "the engine was changed after it was logged: refusing it"
        )


def check_paths(manifest: dict[str, Any]) -> list[str]:
    """The manifest's file paths, each relative and inside the engine folder, once.

    Raises:
        NgraphError: an absolute path, ``..``, a backslash, an empty or duplicate entry,
            more than :data:`MAX_FILES` files or :data:`MAX_ENGINE_BYTES` bytes.
    """
    files = manifest.get("files")
    if not isinstance(files, list):
        raise NgraphError("the engine's manifest has no file list: refusing it")
    if len(files) > MAX_FILES:
        raise NgraphError(
            f"the engine's manifest lists {len(files):,} files, more than the {MAX_FILES:,} "
            "an engine may have: refusing it"
        )
    seen: dict[str, None] = {}  # in order, and a set's lookup
    total = 0
    for entry in files:
        path = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(path, str) or not path or "\\" in path or "\x00" in path:
            raise NgraphError(f"the engine's manifest lists a bad path {path!r}: refusing it")
        parts = PurePosixPath(path).parts
        if path.startswith("/") or ":" in parts[0] or ".." in parts or "." in parts:
            raise NgraphError(
                f"the engine's manifest lists {path!r}, outside the engine folder: refusing it"
            )
        if path in seen or path == MANIFEST:
            raise NgraphError(f"the engine's manifest lists {path!r} twice: refusing it")
        size = entry.get("bytes")
        if type(size) is not int or size < 0 or not isinstance(entry.get("sha256"), str):
            raise NgraphError(f"the engine's manifest gives no size or sha256 for {path!r}")
        total += size
        seen[path] = None
    if total > MAX_ENGINE_BYTES:
        raise NgraphError(
            f"the engine's manifest lists {total:,} bytes, more than the "
            f"{MAX_ENGINE_BYTES:,} an engine may have: refusing it"
        )
    return list(seen)


def check_stored(manifest: dict[str, Any], stored: dict[str, int | None]) -> None:
    """Every file the manifest lists is in the store at the size it says (``stored``: the
    store's listing of the engine folder, path -> bytes, None where the store gives none),
    so that nothing is downloaded that would be refused.

    Raises:
        NgraphError: naming the first file missing or of another size.
    """
    for entry in manifest["files"]:
        path = entry["path"]
        if path not in stored:
            raise NgraphError(f"engine file {path} is missing from the store: refusing it")
        size = stored[path]
        if size is not None and size != entry["bytes"]:
            raise NgraphError(
                f"engine file {path} has {size:,} bytes in the store, the manifest says "
                f"{entry['bytes']:,} (truncated or altered): refusing it before downloading it"
            )


def check_manifest_size(size: int | None) -> None:
    """The manifest's own size (from the store's listing, or on disk) is at most
    :data:`MAX_MANIFEST_BYTES`.

    Raises:
        NgraphError: a bigger one."""
    if size is not None and size > MAX_MANIFEST_BYTES:
        raise NgraphError(
            f"the engine's manifest has {size:,} bytes, more than the {MAX_MANIFEST_BYTES:,} "
            "a manifest may have: refusing it"
        )


def check_manifest(manifest: dict[str, Any]) -> Format:
    """The engine's format, after checking that the manifest is confined, names a known
    format of its compiler, lists the files the loader reads and has its host fields.

    Raises:
        NgraphError: naming what is wrong.
    """
    listed = check_paths(manifest)
    name = manifest.get("format")
    fmt = engine_format(name)
    if fmt is None:
        raise NgraphError(f"the engine's format {name!r} is not one this tool loads: refusing it")
    if manifest.get("compiler") != fmt.compiler:
        raise NgraphError(
            f"the manifest says compiler {manifest.get('compiler')!r} but format {name!r} is "
            f"{fmt.compiler}'s: refusing it"
        )
    compiler = _loader(manifest)
    reads = compiler.loads(name, loader_flags(compiler, manifest)) if compiler else fmt.loads
    unlisted = [f for f in dict.fromkeys((*fmt.loads, *reads)) if f not in listed]
    if unlisted:
        raise NgraphError(
            f"the manifest does not list {', '.join(unlisted)}, the file the {fmt.compiler} "
            "loader reads: refusing it"
        )
    missing = [k for k in HOST_FIELDS if not manifest.get(k)]
    if missing:
        raise NgraphError(
            f"the engine's manifest lacks {', '.join(missing)}: the runtime version and CPU it "
            "was built for cannot be checked: refusing it (pull an engine logged by this tool)"
        )
    return fmt


def _param_text(value: Any) -> str:
    return ("default" if value is None else str(value))[:6000]


def check_against_run(manifest: dict[str, Any], params: dict[str, str], label: str) -> None:
    """The manifest's compiler and flags are the ones the cell run recorded (write-once).

    Raises:
        NgraphError: naming the first difference.
    """
    compiler = params.get("compiler")
    if manifest.get("compiler") != compiler:
        raise NgraphError(
            f"{label}: the engine's manifest says compiler {manifest.get('compiler')!r}, its "
            f"run recorded {compiler!r}: the engine was replaced: refusing it"
        )
    flags = manifest.get("flags")
    if not isinstance(flags, dict):
        raise NgraphError(f"{label}: the engine's manifest has no flags: refusing it")
    recorded = {k[len("flag.") :]: v for k, v in params.items() if k.startswith("flag.")}
    given = {k: _param_text(v) for k, v in flags.items()}
    for key in sorted(set(recorded) | set(given)):
        if recorded.get(key) != given.get(key):
            raise NgraphError(
                f"{label}: the engine's manifest has flag {key}={given.get(key)!r}, its run "
                f"recorded {recorded.get(key)!r}: the engine was replaced: refusing it"
            )


def check_code(manifest: dict[str, Any], trust_code: bool | None) -> None:
    """Refuse an engine whose loading runs code (:func:`runs_code`: its format and flags)
    unless trusted (argument or setting)."""
    code = runs_code(manifest)
    if not code or trusted(trust_code):
        return
    compiler = _loader(manifest)
    name = compiler.name if compiler is not None else manifest.get("compiler") or "unknown"
    raise NgraphError(
        f"this {name} engine is {code}, which runs on this machine when it is "
        "loaded, and anyone who can write the experiment it came from could have made it: "
        f"load it only if you trust them, with --trust-code (or {TRUST_ENV}=1, or "
        "trust_code=True)"
    )
