"""The one compiler interface: flags, compile, engine.

A compiler says how to build and run an engine; it never times anything. Timing, device
synchronisation, resource sampling and statistics live in :mod:`mlflow_ngraph.measure`.

Adding a compiler is one module that subclasses :class:`Compiler` and one registry entry
(``compilers/registry.py`` or the ``mlflow_ngraph.compilers`` entry-point group).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from mlflow_ngraph.errors import NgraphError

if TYPE_CHECKING:
    from mlflow_ngraph.models.base import LoadedModel


@dataclass(frozen=True)
class Flag:
    """One compiler flag: its type, default and allowed values.

    Args:
        type: ``int``, ``float``, ``bool`` or ``str``; command-line strings are parsed to it.
        default: value used when the flag is not given (``None``: the runtime's own default,
            not passed to the runtime and logged as ``default``).
        choices: allowed values, or empty for any value of ``type``.
        help: one line for ``mlflow-ngraph compilers --flags``.
        minimum: smallest allowed number, for ``int``/``float`` flags.
    """

    type: type
    default: Any = None
    choices: tuple = ()
    help: str = ""
    minimum: float | None = None

    def parse(self, compiler: str, name: str, value: Any) -> Any:
        """Convert ``value`` (a YAML scalar or a command-line string) and validate it."""
        try:
            parsed = _convert(self.type, value)
        except (TypeError, ValueError):
            raise NgraphError(
                f"compiler {compiler!r}: flag {name}={value!r} is not a valid {self.type.__name__}"
            ) from None
        if self.choices and parsed not in self.choices:
            allowed = ", ".join(str(c) for c in self.choices)
            raise NgraphError(
                f"compiler {compiler!r}: flag {name}={value!r} is not one of: {allowed}"
            )
        if self.minimum is not None and parsed < self.minimum:
            raise NgraphError(
                f"compiler {compiler!r}: flag {name}={value!r} must be >= {self.minimum}"
            )
        return parsed


def _convert(kind: type, value: Any) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError(value)
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise ValueError(value)
    if kind is int:
        return int(str(value), 0) if isinstance(value, str) else int(value)
    return kind(value)


@dataclass(frozen=True)
class Knob:
    """One flag of a compiler that ``mlflow-ngraph tune`` searches, and the values it tries.

    Args:
        name: the flag (a key of :attr:`Compiler.flags`).
        choices: the values tried, in order (``None``: the runtime's own default).
        when: the knob exists only where these other knobs have these values (inter-op
            threads only with parallel execution): combinations that cannot go together are
            never built.
        precision: the knob can change the arithmetic's precision (bf16, fp16): searched
            only with ``--allow-precision``; the output check judges its engines as any.
    """

    name: str
    choices: tuple
    when: tuple[tuple[str, Any], ...] = ()
    precision: bool = False

    def applies(self, chosen: dict[str, Any]) -> bool:
        """Whether this knob exists given the values ``chosen`` so far."""
        return all(chosen.get(key) == value for key, value in self.when)


@dataclass(frozen=True)
class HostLimits:
    """What a search space may range over on this host."""

    #: cores this process may run on (its affinity), the top of every thread count
    cores: int
    device: str = "cpu"
    scenario: str = "throughput"

    @classmethod
    def here(cls, device: str = "cpu", scenario: str = "throughput") -> HostLimits:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
        return cls(max(1, cores), device, scenario)

    def counts(self, start: int = 1) -> tuple[int, ...]:
        """Powers of two from ``start`` up to the cores, and the cores themselves."""
        values, n = [], start
        while n < self.cores:
            values.append(n)
            n *= 2
        return (*values, self.cores)


@dataclass
class EngineFiles:
    """Files that make up a serialized engine, relative to its directory."""

    files: list[str] = field(default_factory=list)
    format: str = ""


class Engine(ABC):
    """A compiled model bound to one batch size, ready to run.

    The harness calls :meth:`prepare` once (outside the timer), then :meth:`infer` or
    :meth:`run_many` inside it. ``run_many`` is the compiler's best-practice concurrency for
    the throughput scenario; its default is a sequential loop. An engine whose runtime keeps
    requests in flight across calls (OpenVINO's async queue) may also define
    ``start_many(count)``: start ``count`` requests and return once the last is started,
    with :meth:`synchronize` waiting for the rest; the harness then never drains the queue
    between repetitions.
    """

    #: requests the runtime runs at once in the throughput scenario (OpenVINO: the optimal
    #: number of infer requests); the harness sizes each repetition as a multiple of it.
    parallel_requests: int = 1
    #: ``True`` when the engine's work is on an accelerator and needs :meth:`synchronize`.
    asynchronous_device: bool = False

    @abstractmethod
    def prepare(self, inputs: np.ndarray) -> None:
        """Bind ``inputs`` (copied or converted as the runtime needs) for later calls."""

    @abstractmethod
    def infer(self) -> None:
        """Run one request on the prepared inputs and return when its result is ready."""

    def run_many(self, count: int, stamps: list[float] | None = None) -> None:
        """Run ``count`` requests with the runtime's best concurrency; return when done.

        A one-slot engine on the host runs its requests one after another: given ``stamps``,
        it appends ``time.perf_counter()`` as each request ends, so the harness reads every
        request's own time (the differences). An engine whose requests overlap, or run on a
        device queue, is never given ``stamps``.
        """
        if stamps is None:
            for _ in range(count):
                self.infer()
            return
        clock, stamp = time.perf_counter, stamps.append
        for _ in range(count):
            self.infer()
            stamp(clock())

    def infer_in(self, slot: int) -> None:
        """Run one request on the prepared inputs in request slot ``slot`` (``0 <= slot <
        parallel_requests``) and return when it ends. Distinct slots may run at once, each
        from its own thread: a server's dispatchers (``loadgen``'s Server and Offline
        scenarios). With one slot (the default) it is :meth:`infer`."""
        self.infer()

    @abstractmethod
    def outputs(self, inputs: np.ndarray) -> np.ndarray:
        """Run once on ``inputs`` and return its output as a float32 array, or every output
        as a tuple of them when the model has several."""

    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on the CPU)."""

    def save(self, directory: Path) -> EngineFiles:
        """Serialize the engine into ``directory``; returns the files written."""
        return EngineFiles()

    def runtime_settings(self) -> dict[str, Any]:
        """Settings the runtime chose itself (threads, requests), recorded as params."""
        return {}

    def compile_metrics(self) -> dict[str, float]:
        """Numbers about how the engine was built (TVM: tuning seconds, trials, whether it
        was tuned), logged with each batch size's metrics."""
        return {}

    def close(self) -> None:
        """Release runtime resources."""


@dataclass
class CompileContext:
    """What a compile step may use besides the model: a scratch dir and the device."""

    workdir: Path
    device: str
    batch_size: int
    #: root of the local caches; ONNX exports go under ``cache_dir / "exports"``
    cache_dir: Path
    #: "throughput" or "latency": compilers whose runtime has a matching hint use it
    scenario: str = "throughput"
    #: the arithmetic the run measures, one policy for every compiler (compilers/precision.py)
    math: str = "fp32"


class Compiler(ABC):
    """Base class of every compiler. Subclasses set the class attributes and implement
    :meth:`compile` (and :meth:`load` when their engines can be read back from disk)."""

    name: ClassVar[str]
    #: import names of the Python packages this compiler needs
    packages: ClassVar[tuple[str, ...]] = ()
    #: modules its first compile imports besides ``packages`` (a worker process started
    #: ahead of its cell imports them while the cell before it runs)
    preload: ClassVar[tuple[str, ...]] = ()
    #: the distribution whose version identifies the compiler
    distribution: ClassVar[str] = "torch"
    #: the extra that installs it, for error messages
    extra: ClassVar[str] = ""
    #: device kinds it can target
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    #: what deploy checks of its engines (deploy/engine.py check_host): they load only into
    #: the runtime version that wrote them; and what another CPU or GPU than the one they
    #: were built on means: "refuse" (code generated for that machine), "warn" (tuned for
    #: it: it loads, maybe slower), None (nothing)
    exact_version: ClassVar[bool] = False
    cpu_rule: ClassVar[str | None] = None
    gpu_rule: ClassVar[str | None] = None
    #: seconds to get an engine for one batch size of a mid-sized model (ResNet-18, DeiT-S)
    #: on a 2-core host, before this host has a record of it (estimate.py)
    compile_allowance_s: ClassVar[float] = 90.0
    #: its colour in every chart of the MLflow view (tracking/ui.py); None: the others'
    color: ClassVar[str | None] = None
    #: the engine formats its engines are saved in (``EngineFiles.format``): format ->
    #: (the files its loader reads, what runs when it is loaded: "" for a data format).
    #: deploy loads only a declared format, and code only when trusted (deploy/trust.py);
    #: a loader that also reads its flags says what they change (:meth:`loads`,
    #: :meth:`runs_code`)
    engine_formats: ClassVar[dict[str, tuple[tuple[str, ...], str]]] = {}
    flags: ClassVar[dict[str, Flag]] = {}
    #: ``True`` when the engine is the same object for every batch size (eager)
    batch_agnostic: ClassVar[bool] = False
    #: ``True`` when compile starts from the cached ONNX export; the runner exports before it
    #: starts the compile clock, so compile seconds never include the export
    uses_onnx: ClassVar[bool] = False

    @classmethod
    def compile_allowance(cls, flags: dict[str, Any]) -> float:
        """Seconds an engine build with ``flags`` takes before this host has a record of it
        (:attr:`compile_allowance_s`; a compiler whose build time a flag sets, as a
        tuner's trials do, adds it)."""
        return cls.compile_allowance_s

    def version(self) -> str:
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    def availability(self, device: str = "cpu") -> tuple[bool, str]:
        """Whether this compiler can run on ``device`` here, and if not, why."""
        for package in self.packages:
            if importlib.util.find_spec(package) is None:
                hint = f"pip install 'mlflow-ngraph[{self.extra}]'" if self.extra else ""
                return False, f"Python package {package!r} is not installed ({hint})".replace(
                    " ()", ""
                )
        if device not in self.devices:
            return False, f"does not target device kind {device!r} (targets {self.devices})"
        if device == "cuda":
            from mlflow_ngraph.devices import cuda_status

            ok, reason = cuda_status()
            if not ok:
                return False, reason
        return True, "available"

    def math_flags(self, math: str) -> dict[str, Any]:
        """The flag defaults through which it applies the run's ``--math``
        (:mod:`~mlflow_ngraph.compilers.precision`); empty where it reads
        :attr:`CompileContext.math` itself. A flag the user gives still wins."""
        return {}

    def search_space(self, host: HostLimits) -> list[Knob]:
        """The knobs ``mlflow-ngraph tune`` searches on ``host``, in the order they are
        chosen (a knob's ``when`` names only knobs before it); empty: only the defaults.
        A plug-in compiler declares its own next to its :attr:`flags`."""
        return []

    def loads(self, fmt: str, flags: dict[str, Any]) -> tuple[str, ...]:
        """The files :meth:`load` reads of an engine of format ``fmt`` loaded with ``flags``
        (resolved): by default what :attr:`engine_formats` declares of the format."""
        return tuple(self.engine_formats.get(fmt, ((), ""))[0])

    def runs_code(self, fmt: str, flags: dict[str, Any]) -> str:
        """What runs on this machine when :meth:`load` loads an engine of format ``fmt``
        with ``flags`` (resolved), "" when it loads data only: by default what
        :attr:`engine_formats` declares of the format. A loader that picks what it loads by
        a flag (an execution provider's engine cache, a custom-operator library) says so
        here: deploy asks it before anything is loaded, and loads code only when trusted
        (deploy/trust.py)."""
        return self.engine_formats.get(fmt, ((), ""))[1]

    def writes_engine(self, flags: dict[str, Any]) -> bool:
        """Whether its engines under ``flags`` are files that can be deployed (``pull``):
        False for engines that exist only in the process that built them."""
        return True

    def resolve_flags(self, given: dict[str, Any]) -> dict[str, Any]:
        """Validate ``given`` against :attr:`flags` and fill in defaults."""
        unknown = sorted(set(given) - set(self.flags))
        if unknown:
            known = ", ".join(sorted(self.flags)) or "none"
            raise NgraphError(
                f"compiler {self.name!r} has no flag {unknown[0]!r} (its flags: {known})"
            )
        resolved = {}
        for key, spec in self.flags.items():
            resolved[key] = spec.parse(self.name, key, given[key]) if key in given else spec.default
        return resolved

    @abstractmethod
    def compile(self, model: LoadedModel, flags: dict[str, Any], ctx: CompileContext) -> Engine:
        """Build an engine for ``model`` at ``ctx.batch_size``; raise on failure."""

    def load(
        self, model: LoadedModel, flags: dict[str, Any], ctx: CompileContext, directory: Path
    ) -> Engine | None:
        """Load an engine saved by :meth:`Engine.save` (engine cache hit); ``None`` if the
        compiler cannot reload its engines."""
        return None
