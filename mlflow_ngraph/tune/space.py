"""The search space of a tune: each compiler's knobs (:meth:`Compiler.search_space`), what
the user pinned, and what cannot go together.

One configuration is ``(compiler name, flags)`` with the flags resolved as a benchmark cell's
(so a trial and a benchmark of the same settings are the same cell). Optuna sees the space
define-by-run: the compiler first, then that compiler's knobs in order, each only where its
``when`` holds; the same walk enumerates the grid.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mlflow_ngraph.compilers.base import Compiler, HostLimits, Knob
from mlflow_ngraph.errors import NgraphError

COMPILER_PARAM = "compiler"
IDENTITY = "identity"


def param_name(compiler: str, knob: str) -> str:
    """The Optuna parameter of one compiler's knob (``onnxruntime.execution_mode``)."""
    return f"{compiler}.{knob}"


@dataclass
class CompilerSpace:
    """One compiler's part of the space."""

    compiler: Compiler
    #: flags every configuration of it has: the device profile's, then the user's pins
    fixed: dict[str, Any]
    knobs: list[Knob]

    def walk(self, choose) -> dict[str, Any]:
        """The knobs' values, each asked of ``choose(knob, chosen so far)`` where it applies."""
        chosen: dict[str, Any] = dict(self.fixed)
        for knob in self.knobs:
            if knob.applies(chosen):
                chosen[knob.name] = choose(knob, chosen)
        return chosen

    def flags(self, chosen: dict[str, Any]) -> dict[str, Any]:
        """``chosen`` resolved as a cell's flags (``None``: the runtime's own default)."""
        given = {k: v for k, v in chosen.items() if v is not None}
        return self.compiler.resolve_flags(given)

    def grid(self) -> Iterator[dict[str, Any]]:
        """Every configuration, each once."""
        seen: set[str] = set()
        for chosen in self._combinations(0, dict(self.fixed)):
            try:
                flags = self.flags(chosen)
            except NgraphError:  # the compiler's own rules refuse the combination
                continue
            key = json.dumps(flags, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                yield flags

    def _combinations(self, index: int, chosen: dict[str, Any]) -> Iterator[dict[str, Any]]:
        if index == len(self.knobs):
            yield chosen
            return
        knob = self.knobs[index]
        if not knob.applies(chosen):
            yield from self._combinations(index + 1, chosen)
            return
        for value in knob.choices:
            yield from self._combinations(index + 1, {**chosen, knob.name: value})


@dataclass
class SearchSpace:
    """The compilers a tune searches and their knobs."""

    spaces: dict[str, CompilerSpace] = field(default_factory=dict)

    @property
    def compilers(self) -> list[str]:
        return list(self.spaces)

    def suggest(self, trial) -> tuple[str, dict[str, Any]]:
        """An Optuna trial's configuration: the compiler, then its knobs (define-by-run)."""
        name = trial.suggest_categorical(COMPILER_PARAM, self.compilers)
        space = self.spaces[name]

        def choose(knob: Knob, chosen: dict[str, Any]) -> Any:
            return trial.suggest_categorical(param_name(name, knob.name), list(knob.choices))

        return name, space.flags(space.walk(choose))

    def defaults(self) -> list[tuple[str, dict[str, Any], dict[str, Any] | None]]:
        """Each compiler's default configuration, as ``(name, flags, Optuna params)``: the
        first trials, so the tune never ends worse than the defaults it measured (params
        ``None``: the default is outside the searched values, e.g. a hint left to the
        scenario; it is measured and compared, and Optuna is not told of it)."""
        out = []
        for name, space in self.spaces.items():
            flags = space.flags(space.fixed)
            out.append((name, flags, self.params_of(name, flags)))
        return out

    def params_of(self, name: str, flags: dict[str, Any]) -> dict[str, Any] | None:
        """The Optuna params that give ``flags`` for compiler ``name`` (``None``: a
        configuration outside the space)."""
        space = self.spaces.get(name)
        if space is None:
            return None
        params: dict[str, Any] = {COMPILER_PARAM: name}
        for knob in space.knobs:
            if not knob.applies(flags):
                continue
            value = flags.get(knob.name)
            if value not in knob.choices:
                if None in knob.choices and space.flags({}).get(knob.name) == value:
                    value = None
                else:
                    return None
            params[param_name(name, knob.name)] = value
        return params

    def grid(self) -> list[tuple[str, dict[str, Any]]]:
        return [(name, flags) for name, space in self.spaces.items() for flags in space.grid()]

    def size(self) -> int:
        return sum(1 for _ in self.grid())


def build_space(
    compilers: list[tuple[Compiler, dict[str, Any], dict[str, Any]]],
    host: HostLimits,
    allow_precision: bool = False,
) -> SearchSpace:
    """The space of ``compilers``: ``(compiler, the profile's flags, the user's pins)``.

    Raises:
        NgraphError: a pinned flag the compiler lacks; a pin that its own exclusions rule
            out; ``allow_precision`` where no compiler has a precision knob; nothing to
            search.
    """
    space = SearchSpace()
    for compiler, profile_flags, pins in compilers:
        if compiler.name == IDENTITY:
            continue  # the baseline of every speedup: always measured, never searched
        compiler.resolve_flags(pins)  # an unknown flag or a bad value: one line
        knobs = _knobs(compiler, host, allow_precision)
        fixed = {**{k: v for k, v in profile_flags.items() if k in compiler.flags}, **pins}
        for knob in knobs:
            if knob.name in pins and not knob.applies(fixed):
                need = ", ".join(f"{k}={v}" for k, v in knob.when)
                raise NgraphError(
                    f"compiler {compiler.name!r}: {knob.name} is pinned but only exists with "
                    f"{need}: pin that too, or drop the pin"
                )
        knobs = [k for k in knobs if k.name not in pins]
        space.spaces[compiler.name] = CompilerSpace(compiler, fixed, knobs)
    if not space.spaces:
        raise NgraphError(
            "nothing to search: identity is the baseline of every trial, not a candidate; "
            "name a compiler with --compiler (see 'mlflow-ngraph compilers')"
        )
    if allow_precision and not any(
        knob.precision for c, *_ in compilers for knob in c.search_space(host)
    ):
        names = ", ".join(space.spaces)
        raise NgraphError(
            f"--allow-precision: none of {names} has a precision knob (openvino and "
            "tensorrt have one); drop --allow-precision or add such a compiler"
        )
    if space.size() < 2 and len(space.spaces) == 1:
        only = next(iter(space.spaces))
        raise NgraphError(
            f"the search space of {only} is one configuration (its knobs are all pinned or "
            "it has none): measure it with 'mlflow-ngraph benchmark', or unpin a knob"
        )
    return space


def _knobs(compiler: Compiler, host: HostLimits, allow_precision: bool) -> list[Knob]:
    knobs = []
    for knob in compiler.search_space(host):
        if knob.name not in compiler.flags:
            raise NgraphError(
                f"compiler {compiler.name!r} declares knob {knob.name!r}, which is not one of "
                f"its flags ({', '.join(sorted(compiler.flags))})"
            )
        if knob.precision and not allow_precision:
            continue
        knobs.append(knob)
    return knobs
