"""What this host measured before: each engine's kept figures, and the spread between sittings.

Every kept measurement of an engine at a batch size is appended to the home, one file per
engine on this host (``<home>/history/<host>/<engine>.jsonl``; the engine is the model, its
parameters, the compiler and its flags, the scenario, the device profile, the batch size and
the runtimes' versions; the host is the CPU model and core count; a GPU profile's engines in
a folder of their own beneath it, :func:`folder`). Two uses:

- **the guard**: a new figure is set against the same engine measured earlier on this host.
  A move beyond what both sittings' intervals and the host's spread between sittings allow
  is *said* (a warning and the ``ngraph.moved.bs<b>`` tag), and a gross one (more than
  :data:`GROSS_MOVE`) marks the measurement UNSTABLE, naming a contended host where it was
  one: on a busy 2-core host a threaded engine of a small model can run 10-20x slower than
  the load's share explains (its threads wait for each other at every operator);
- **the spread between sittings** (:func:`spread`): each engine measured in several
  sittings gives the variance of its figure from sitting to sitting beyond what each
  sitting's rounds showed; pooled over every engine (a variance-components estimate with
  its degrees of freedom), by model family where a family has enough of them. It is what a
  re-run interval is built from (:func:`rerun_interval`): measured on this host, never
  assumed.

Only uncontended, STABLE figures enter the spread; every kept figure enters the guard's
record. A line that cannot be read is skipped; the files are append-only and bounded
(:data:`KEEP` lines per engine).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

#: a figure that moved by more than this against every earlier measurement of the same
#: engine on this host (beyond what the intervals allow) is marked UNSTABLE
GROSS_MOVE = 0.25
#: the spread between sittings the guard allows where this host has not measured its own
#: (sd of the log): the largest seen on a quiet 2-core VM (docs/measurement.md), so that
#: only what is clearly more than a re-run's spread is said
GUARD_SD = 0.03
#: lines kept per engine (older ones are dropped when the file is rewritten)
KEEP = 20
#: degrees of freedom a model family needs before it gets a spread of its own
FAMILY_MIN_DF = 10
#: degrees of freedom the spread needs before a re-run interval is built on it
MIN_DF = 3
#: an engine counts in the spread with at most this many of its latest sittings (an old
#: state of the host says less of the next re-run)
SPREAD_LATEST = 6
Z95 = 1.959963984540054


@dataclass
class Entry:
    """One kept measurement of an engine at a batch size."""

    time: float
    family: str
    throughput: float
    throughput_h: float | None  # the sitting's 95% half-width, log scale
    speedup: float | None = None
    speedup_h: float | None = None
    contended: bool = False  # other processes took more than --max-other-cpu, or steal
    stable: bool = True
    other_cpu: float | None = None
    load: float | None = None
    #: the invocation of the tool that measured it (its sittings share that occasion's
    #: offset); "" in lines written before occasions were kept: each its own occasion
    occasion: str = ""
    #: the engine's group: the model and batch size measured together (:func:`group_key`),
    #: whose engines share a sitting's offset (a speedup's baseline, the host's state):
    #: they count once in the degrees of freedom; "" in older lines (each its own group)
    group: str = ""
    #: the host probe's reading around its rounds (measure/hostprobe.py): the memory's speed
    #: (GB/s), the two threads' meeting (adds/s); None where unread
    memory: float | None = None
    join: float | None = None


@dataclass(frozen=True)
class Spread:
    """The host's spread between sittings of one kind of figure (sd of the log), with its
    degrees of freedom and what it was estimated from, in two components: ``sd``, a
    sitting's own offset (what differs between two sittings of one run), and ``between``,
    the offset of an occasion that all of its sittings share (what differs between two runs
    beyond that: the host in another state, minutes or hours later). A run's figure, the
    mean of its N sittings, moves between runs by ``sqrt(sd^2 / N + between^2)``
    (:meth:`of_mean`)."""

    sd: float
    df: int
    source: str  # e.g. "this host's history: 14 engines, 2-3 sittings each"
    between: float = 0.0
    between_df: int = 0

    def of_mean(self, n: int) -> Spread:
        """The spread of the mean of ``n`` sittings of one run, one component, with the
        Welch-Satterthwaite degrees of freedom of its two parts."""
        a, b = self.sd**2 / n, self.between**2
        parts = [(v, d) for v, d in ((a, self.df), (b, self.between_df)) if d > 0]
        if a + b <= 0 or not parts:
            df = max(self.df, self.between_df)
        else:
            df = (a + b) ** 2 / sum(v * v / d for v, d in parts if v > 0)
        return Spread(math.sqrt(a + b), max(int(df), 1), self.source)

    def words(self) -> str:
        """The spread as the record and the log say it."""
        runs = f"{100 * self.between:.2f}% ({self.between_df} df) between runs"
        if not self.df:
            return f"sd {runs} from {self.source}"
        text = f"sd {100 * self.sd:.2f}% ({self.df} df)"
        if self.between_df:
            text += f" between sittings, {runs}"
        return f"{text} from {self.source}"


@dataclass(frozen=True)
class Move:
    """A figure that moved against the same engine measured earlier on this host."""

    what: str  # throughput or speedup
    ratio: float  # now over then
    then: Entry
    gross: bool
    text: str
    #: beyond what both figures' intervals and the spread between sittings allow (a move
    #: past :data:`GROSS_MOVE` that the spread allows is said, not judged on)
    beyond: bool = True


def host_key() -> str:
    from mlflow_ngraph.env import host_fingerprint

    return hashlib.sha256(host_fingerprint().encode()).hexdigest()[:16]


def engine_key(
    model: str,
    params: dict,
    compiler: str,
    flags: dict,
    scenario: str,
    device: str,
    batch_size: int,
    versions: dict | None = None,
) -> str:
    """The name of one engine's history: what makes two measurements of the same thing."""
    if versions is None:
        versions = _versions()
    text = json.dumps(
        [model, params, compiler, flags, scenario, device, batch_size, versions],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def group_key(
    model: str, params: dict, scenario: str, device: str, batch_size: int,
    versions: dict | None = None,
) -> str:  # fmt: skip
    """The name of the group an engine is measured in: its model at a batch size on a
    device, every compiler's engine of it (they share the baseline their speedups divide
    by, and the sitting's host)."""
    return engine_key(model, params, "", {}, scenario, device, batch_size, versions)


@functools.cache
def _versions() -> dict[str, str]:
    """The runtimes' versions, read once per process (each read scans the installed
    packages' metadata)."""
    from mlflow_ngraph.env import library_versions

    return library_versions()


def folder(home: str | os.PathLike, kind: str = "cpu") -> Path:
    """This host's history in ``home``; a device kind other than the CPU (``cuda``: the
    engines of a GPU profile) has a folder of its own beneath it, so that its spread is
    its own, never pooled with the CPU engines measured on the same host."""
    base = Path(home) / "history" / host_key()
    return base if kind == "cpu" else base / kind


def kind_of(device: str) -> str:
    """The device kind (``cpu``, ``cuda``) of the profile named ``device``; ``cpu`` for
    a name no profile has."""
    from mlflow_ngraph.devices import PROFILES

    profile = PROFILES.get(device.partition("/")[0])
    return profile.kind if profile is not None else "cpu"


def _read(path: Path) -> list[Entry]:
    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                data = json.loads(line)
                out.append(Entry(**data))
            except (ValueError, TypeError):
                continue  # a line cut by a kill, or of another version: skipped
    return out


def earlier(home, key: str, kind: str = "cpu") -> list[Entry]:
    """The kept measurements of engine ``key`` on this host, oldest first."""
    return _read(folder(home, kind) / f"{key}.jsonl")


def append(home, key: str, entry: Entry, kind: str = "cpu") -> None:
    """Add ``entry`` to engine ``key``'s history; past 2 x :data:`KEEP` lines the file is
    rewritten with the latest :data:`KEEP`. The append and the rewrite hold the file's lock
    (two workers or two runs at once: a line appended while another rewrote the file would
    be lost with the old file), and a writer that waited on a file replaced meanwhile opens
    the new one. A home that cannot be written costs the history, never the measurement."""
    import fcntl

    path = folder(home, kind) / f"{key}.jsonl"
    line = json.dumps(asdict(entry), separators=(",", ":")) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.fstat(fd).st_ino == os.stat(path).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)  # replaced while this one waited: the lock of a file no one reads
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = "\n" + line  # after a line a kill cut short: never glued to it
            os.write(fd, line.encode())
            entries = _read(path)
            if len(entries) > 2 * KEEP:
                tmp = path.with_suffix(f".tmp-{os.getpid()}")
                tmp.write_text(
                    "".join(
                        json.dumps(asdict(e), separators=(",", ":")) + "\n" for e in entries[-KEEP:]
                    ),
                    encoding="utf-8",
                )
                os.replace(tmp, path)
        finally:
            os.close(fd)  # the lock goes with it
    except OSError:
        pass


def _log_sd(h: float | None) -> float:
    return 0.0 if h is None or not math.isfinite(h) else h / Z95


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def check(
    entries: list[Entry], now: Entry, spread: float | None, max_other_cpu: float
) -> Move | None:
    """Whether ``now`` moved against every earlier measurement in ``entries`` by more than
    both sittings' intervals and the spread between sittings (``spread``, sd of the log;
    :data:`GUARD_SD` where the host has not measured one) allow. The earlier measurement
    nearest to ``now`` is the one named: a figure that agrees with any earlier one has not
    moved (one bad sitting in the history does not mark every later good one). Only a move
    against an earlier STABLE, uncontended measurement is gross: where the history holds
    only noisy ones, a move is said, and the earlier one is the suspect.

    One that agrees with an older measurement but moved by more than :data:`GROSS_MOVE`
    against another trusted run before this one (another occasion) is said too, not gross:
    the engine's speed on this host changes between runs by that much (a threaded engine
    of a small model an hour apart), which a re-run meets and its user must hear. The
    latest such run is the one named, even where the spread allows the move (``beyond``
    False). Past :data:`GROSS_MOVE` is the same up or down (:func:`past_gross`).

    Where other runs measured the engine, the earlier sittings of ``now``'s own run
    (its occasion) are left out: a run's second sitting agrees with its first whatever
    the host did between runs (on 2026-11-27 eager PyTorch's throughput fell 21% from one
    run to the next, both sittings of the second run alike, and nothing was said)."""
    sd = GUARD_SD if spread is None else max(spread, 0.0)
    trusted = [e for e in entries if e.stable and not e.contended]
    entries = trusted or entries
    if now.occasion:
        entries = [e for e in entries if e.occasion != now.occasion] or entries
    found = None
    for what in ("speedup", "throughput"):
        value, h = getattr(now, what), getattr(now, f"{what}_h")
        if not value or value <= 0:
            continue
        beyond = []  # (log distance beyond what is allowed, log ratio, the earlier one)
        for then in entries:
            old = getattr(then, what)
            if not old or old <= 0:
                continue
            d = math.log(value / old)
            allowed = Z95 * math.sqrt(
                2 * sd**2 + _log_sd(h) ** 2 + _log_sd(getattr(then, f"{what}_h")) ** 2
            )
            beyond.append((abs(d) - allowed, d, then))
        if not beyond:
            continue
        move = _nearest_move(what, beyond, now, bool(trusted), max_other_cpu)
        if move is None and trusted:
            move = _latest_run_move(what, beyond, now, max_other_cpu, sd)
        if move is not None and (found is None or (move.gross and not found.gross)):
            found = move
    return found


def _nearest_move(what, beyond, now: Entry, trusted: bool, max_other_cpu: float):
    """The move against the nearest earlier measurement, where even that one is beyond
    what the intervals allow (gross past :data:`GROSS_MOVE` when the earlier ones are
    trusted)."""
    excess, d, then = min(beyond, key=lambda x: x[0])
    if excess <= 0:
        return None  # within what some earlier measurement allows
    ratio = math.exp(d)
    gross = trusted and past_gross(ratio)
    return Move(what, ratio, then, gross, _text(what, ratio, then, now, max_other_cpu))


def past_gross(ratio: float) -> bool:
    """Whether a figure ``ratio`` times an earlier one moved by more than
    :data:`GROSS_MOVE`, up or down alike: the larger over the smaller past 1.25 (a fall to
    0.77x is the same move as a rise to 1.31x; measured as 1 - ratio it would pass for
    23%)."""
    return ratio > 0 and abs(math.log(ratio)) > math.log1p(GROSS_MOVE)


def _latest_run_move(what, beyond, now: Entry, max_other_cpu: float, sd: float):
    """The move against the latest earlier run of the engine (another occasion than
    ``now``'s) that ``now`` is past :data:`GROSS_MOVE` from, while the nearest measurement
    agrees within what the intervals and the spread ``sd`` allow: said, not gross. Said
    even where that spread allows the move itself: on a host whose runs spread by 10%
    (sd of the log) eager PyTorch read 14.6/s in one run and 18.9/s in the next (+29%)
    and nothing was said."""
    others = [
        b
        for b in beyond
        if (not now.occasion or b[2].occasion != now.occasion) and past_gross(math.exp(b[1]))
    ]
    if not others:
        return None
    excess, d, then = max(others, key=lambda x: x[2].time)
    ratio = math.exp(d)
    latest = max(
        (b[2] for b in beyond if not now.occasion or b[2].occasion != now.occasion),
        key=lambda e: e.time,
    )
    which = "the latest run before this one" if then is latest else "an earlier run"
    _, near, agrees = min(beyond, key=lambda x: x[0])
    if past_gross(math.exp(near)):  # no earlier one is near: the spread alone allows it
        why = f"within what this host's spread between runs allows (sd {100 * sd:.1f}%)"
    else:
        why = (
            f"it agrees with the one at {_when(agrees.time)} ({getattr(agrees, what):.4g}"
            f"{'x' if what == 'speedup' else '/s'})"
        )
    text = (
        f"{_text(what, ratio, then, now, max_other_cpu)}, {which}; {why}: this engine's "
        f"{what} on this host changes between runs by more than {100 * GROSS_MOVE:.0f}%"
    )
    return Move(what, ratio, then, False, text, beyond=excess > 0)


def _factor(ratio: float) -> str:
    if ratio >= 2 or ratio <= 0.5:
        return f"{ratio:.3g}x" if ratio >= 1 else f"{1 / ratio:.3g}x lower"
    return f"{100 * (ratio - 1):+.1f}%"


#: what a move is against, as the guard says it: a sitting of this same run (no other run
#: measured the engine yet: the host drifted during the run), or another run
WITHIN_RUN = "this run's earlier sitting of this engine"
OTHER_RUN = "this engine measured on this host"


def _text(what: str, ratio: float, then: Entry, now: Entry, max_other_cpu: float) -> str:
    old = getattr(then, what)
    # a sitting of this same run (no other run has measured the engine): the host drifted
    # between the run's sittings, which the run's own spread carries
    where = WITHIN_RUN if now.occasion and then.occasion == now.occasion else OTHER_RUN
    text = (
        f"the {what} moved {_factor(ratio)} against {where} at "
        f"{_when(then.time)} ({old:.4g}{'x' if what == 'speedup' else '/s'})"
    )
    if ratio < 1 and now.contended:
        busy = (
            f"other processes used {now.other_cpu:.0f}% of the CPU"
            if now.other_cpu is not None
            else "the host was busy"
        )
        text += (
            f": the host was contended ({busy}, > {max_other_cpu:g}%); a threaded engine of a "
            "small model collapses far beyond the load's share on a busy host (its threads "
            "wait for each other at every operator)"
        )
    elif then.contended or not then.stable:
        text += (
            ": that earlier measurement was made on a contended host"
            if then.contended
            else ": that earlier measurement was UNSTABLE"
        )
    return text + _state_words(then, now)


def _state_words(then: Entry, now: Entry) -> str:
    """What the host's state did between ``then`` and ``now``, where a probe read around
    both's rounds differed as far as the host's two states do (measure/hostprobe.py): a
    move of the host, which no run can pair away; else ""."""
    from mlflow_ngraph.measure.hostprobe import SLOW, WORDS

    for kind, unit in (("join", "adds/s"), ("memory", "GB/s")):
        before, after = getattr(then, kind), getattr(now, kind)
        if not before or not after or SLOW < after / before < 1 / SLOW:
            continue
        reading, cause = WORDS[kind]
        state = "slower" if after < before else "faster"
        return (
            f"; {reading} read {_figure(after)} {unit} around these rounds against "
            f"{_figure(before)} {unit} then, the host's {state} state ({cause})"
        )
    return ""


def _figure(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _trusted(path: Path, what: str, entries: list[Entry] | None = None) -> list[Entry]:
    """An engine's uncontended, STABLE sittings with a figure of ``what``, oldest first (of
    ``entries`` where the caller read its file already)."""
    return [
        e
        for e in (_read(path) if entries is None else entries)
        if e.stable and not e.contended and getattr(e, what) and getattr(e, what) > 0
    ]


def _in_spread(path: Path, what: str, entries: list[Entry] | None = None) -> list[Entry]:
    """The sittings of one engine the spread rests on: its latest :data:`SPREAD_LATEST`
    trusted ones, where it has two or more (else none)."""
    kept = _trusted(path, what, entries)[-SPREAD_LATEST:]
    return kept if len(kept) >= 2 else []


def _sitting(e: Entry, what: str) -> tuple:
    """A sitting as the variance components read it: (log figure, its own sd of the log,
    occasion, group)."""
    return (math.log(getattr(e, what)), _log_sd(getattr(e, f"{what}_h")), e.occasion, e.group)


def spread(home, what: str, family: str | None = None, kind: str = "cpu") -> Spread | None:
    """The host's spread between sittings of ``what`` (``throughput`` or ``speedup``) from
    its history: every engine measured in two or more uncontended, STABLE sittings (its
    latest :data:`SPREAD_LATEST`), pooled by :func:`pooled_spread`. (Sittings UNSTABLE
    only for their width are left out too: docs/measurement.md says what counting them
    did.) ``None`` with fewer
    than :data:`MIN_DF` degrees of freedom."""
    base = folder(home, kind)
    if not base.is_dir():
        return None
    by_family: dict[str, list[list[tuple]]] = {}
    for path in sorted(base.glob("*.jsonl")):
        kept = _in_spread(path, what)
        if kept:
            by_family.setdefault(kept[-1].family or "-", []).append(
                [_sitting(e, what) for e in kept]
            )
    return pooled_spread(by_family, family, "this host's history")


def spread_share(home, what: str, occasions: set[str], kind: str = "cpu") -> dict[str, int]:
    """What became of the ``what`` figures measured on ``occasions`` (invocations of the
    tool): how many were ``measured``, how many the spread rests on (``used``: as
    :func:`spread` selects them), and of the rest, how many were ``unstable``, measured on
    a ``contended`` host, or ``alone`` (their engine has no second such sitting)."""
    share = dict.fromkeys(("measured", "used", "unstable", "contended", "alone"), 0)
    for path in sorted(folder(home, kind).glob("*.jsonl")):
        entries = _read(path)
        kept = _in_spread(path, what, entries)
        for e in entries:
            if e.occasion not in occasions or not (getattr(e, what) or 0) > 0:
                continue
            share["measured"] += 1
            cause = "used" if e in kept else "contended" if e.contended else None
            share[cause or ("unstable" if not e.stable else "alone")] += 1
    return share


#: a run's moves against its history are wider than the history's spread allows where
#: their F ratio lies above this quantile
STATE_ALPHA = 0.01


@dataclass(frozen=True)
class StateShift:
    """How far one run's figures of ``what`` moved from this host's history (the same
    engines' earlier runs), against what the history's spread allows them: where they
    moved more (an F test at :data:`STATE_ALPHA`), the host was in a state its history had
    not measured, and a re-run is judged on the spread between runs this run's own moves
    give (``between``; per model family ``by_family``: (sd of the log, df))."""

    what: str
    engines: int
    df: int  # this run's groups: engines measured together share the host's state
    rms: float  # root mean square of the moves (log)
    allowed: float  # what the history's spread gave them (log, root mean square)
    median: float  # the median move (log): the host's speed as a whole
    between: float  # the spread between runs these moves give, every engine (sd of the log)
    by_family: dict[str, tuple[float, int]]

    def words(self) -> str:
        """One line: the moves against the history, and what the run is judged on."""
        return (
            f"this run's {self.what}s moved {100 * self.rms:.1f}% (root mean square; median "
            f"{100 * math.expm1(self.median):+.1f}%) from this host's earlier runs of the "
            f"same {self.engines} engines, where their spread allows {100 * self.allowed:.1f}%"
            f": the host is in a state its history has not measured (its load, another "
            f"process, its clock); the re-run intervals of this run rest on these moves, "
            f"{100 * self.between:.2f}% between runs ({self.df} df)"
        )


@dataclass(frozen=True)
class _Moved:
    """One engine's move in :func:`run_against_history`: ``d`` (log), its expectation
    under its family's spread, the part of that its sittings' noise gives, the history's
    spread between runs in it (``b / r``: the mean of ``r`` earlier runs), its group."""

    family: str
    d: float
    expected: float
    noise: float
    earlier: float
    group: object


def run_against_history(home, what: str, occasion: str, kind: str = "cpu") -> StateShift | None:
    """Whether the run ``occasion`` moved its figures of ``what`` further from the same
    engines' earlier runs on this host than the history's spread (without this run)
    allows: a :class:`StateShift` where it did, else ``None`` (also without a history to
    judge it by).

    Each engine measured in this run and in an earlier one moves by ``d``, this run's mean
    log figure less the mean of its ``R`` earlier runs' (their latest
    :data:`SPREAD_LATEST` sittings); its family's spread in the history
    (:func:`pooled_spread`: ``between``, ``within``, and each sitting's own noise) gives
    ``E[d^2] = between (1 + 1/R) + within / n + own + ...``. The ratio of the mean ``d^2``
    to its mean expectation is taken as F on (this run's groups, the spread's degrees of
    freedom): a group's engines share the host's state and move together, so they count
    once. Where it lies past the ``1 - STATE_ALPHA`` quantile, each family's spread
    between runs in this state is the mean of ``d^2 - noise - between / R`` over its
    engines (method of moments), with its groups' degrees of freedom. Seen 2026-11-27: a
    spread measured in a quiet hour (0.37% between runs) judged a noisier hour's run,
    whose figures moved 3-5%, and its intervals held the next run's speedups 87.5% of the
    time."""
    from scipy import stats

    if not occasion or not folder(home, kind).is_dir():
        return None
    by_family, pairs = _split(folder(home, kind), what, occasion)
    known = pooled_spread(by_family, None, "this host's history")
    if known is None or not pairs:
        return None
    spreads = {f: pooled_spread(by_family, f, "") for f, _, _ in pairs}
    moves = [_move(f, now, before, spreads[f], what) for f, now, before in pairs]
    k = len({m.group for m in moves})
    ms = sum(m.d * m.d for m in moves) / len(moves)
    allowed = sum(m.expected for m in moves) / len(moves)
    if allowed > 0 and ms / allowed <= stats.f.ppf(1 - STATE_ALPHA, k, known.of_mean(1).df):
        return None
    if allowed <= 0 and ms <= 0:
        return None
    per_family = {
        f: _between([m for m in moves if m.family == f], spreads[f]) for f in spreads
    }  # fmt: skip
    between, _ = _between(moves, known)
    return StateShift(
        what, len(moves), k, math.sqrt(ms), math.sqrt(allowed),
        statistics.median(m.d for m in moves), between, per_family,
    )  # fmt: skip


def _split(base: Path, what: str, occasion: str):
    """The history without the run ``occasion`` (each engine's sittings as
    :func:`pooled_spread` reads them, by family), and each engine it measured that earlier
    runs measured too: (family, its sittings in this run, its latest earlier ones)."""
    by_family: dict[str, list[list[tuple]]] = {}
    pairs: list[tuple[str, list[Entry], list[Entry]]] = []
    for path in sorted(base.glob("*.jsonl")):
        kept = _trusted(path, what)
        if not kept:
            continue
        now = [e for e in kept if e.occasion == occasion]
        before = [e for e in kept if e.occasion != occasion][-SPREAD_LATEST:]
        family = kept[-1].family or "-"
        if len(before) >= 2:
            by_family.setdefault(family, []).append([_sitting(e, what) for e in before])
        if now and before:
            pairs.append((family, now, before))
    return by_family, pairs


def _move(family: str, now: list[Entry], before: list[Entry], spread: Spread, what: str):
    """:class:`_Moved` of an engine's sittings in this run (``now``) and earlier ones."""
    w, b = spread.sd**2, spread.between**2
    occasions = _occasions([_sitting(e, what) for e in before])
    r = len(occasions)
    means = [sum(x[0] for x in g) / len(g) for g in occasions]
    d = sum(math.log(getattr(e, what)) for e in now) / len(now) - sum(means) / r
    noise = sum(_log_sd(getattr(e, f"{what}_h")) ** 2 for e in now) / len(now) ** 2
    noise += w / len(now) + sum(
        w / len(g) + sum(x[1] ** 2 for x in g) / len(g) ** 2 for g in occasions
    ) / (r * r)
    return _Moved(family, d, b * (1 + 1 / r) + noise, noise, b / r, now[-1].group or id(now))


def _between(moves: list[_Moved], spread: Spread) -> tuple[float, int]:
    """(sd of the log, df): the spread between runs that ``moves`` give this run's state,
    no narrower than ``spread``'s."""
    if not moves:
        return spread.between, spread.between_df
    var = sum(m.d * m.d - m.noise - m.earlier for m in moves) / len(moves)
    return math.sqrt(max(var, spread.between**2)), len({m.group for m in moves})


def with_shift(
    known: Spread | None, shift: StateShift | None, family: str | None = None
) -> Spread | None:
    """``known`` (a spread from the history, of ``family``'s engines) with the spread
    between runs that ``shift`` (this run's moves against the history) gives that family
    (every engine's where it has none), where that is wider."""
    if shift is None or known is None:
        return known
    between, df = shift.by_family.get(family or "-", (shift.between, shift.df))
    if between <= known.between:
        return known
    return Spread(
        known.sd,
        known.df,
        f"{known.source}; between runs from this run's moves against it: {shift.engines} "
        f"engines, the host in another state",
        between,
        df,
    )


def given_or_measured(
    home, what: str, family: str | None, rerun_sd: float | None, kind: str = "cpu"
):
    """The spread a re-run interval uses: ``--rerun-sd`` where given, else :func:`spread`."""
    if rerun_sd is not None:
        return Spread(rerun_sd, 10**6, "--rerun-sd")
    return spread(home, what, family, kind)


def variance_components(
    engines: list[list[tuple]], clusters: list | None = None
) -> tuple[float, int]:
    """(variance between sittings, degrees of freedom) of log figures: for each engine its
    sittings' (log figure, that sitting's own sd of the log), the squares about the engine's
    mean less what each sitting's own noise accounts for, pooled over engines (method of
    moments, clamped at zero), over the sittings less one per engine. The degrees of
    freedom count each of ``clusters`` (one key per engine; None: an engine of its own)
    once, with its most sittings less one: engines that share their sittings' offsets (a
    group's speedups divide by one baseline) do not tell them apart. NaN variance without
    any."""
    part = _within(engines, clusters)
    return part.var, part.df


@dataclass(frozen=True)
class _Part:
    """One variance component as its estimate came about: ``var`` (clamped at zero, NaN
    without degrees of freedom) and ``df``; ``ms``, the raw mean square of its squares,
    and ``noise``, what the parts beneath it account for of that mean square (the
    sittings' own intervals; between runs, the sittings' offsets too), so that
    ``var = max(ms - noise, 0)``."""

    var: float
    df: int
    ms: float = math.nan
    noise: float = math.nan


def _within(engines: list[list[tuple]], clusters: list | None = None) -> _Part:
    """:func:`variance_components` with the mean squares it came from."""
    ss = own = 0.0
    n_df = 0
    for sittings in engines:
        n = len(sittings)
        mean = sum(x[0] for x in sittings) / n
        ss += sum((x[0] - mean) ** 2 for x in sittings)
        own += (1 - 1 / n) * sum(x[1] * x[1] for x in sittings)
        n_df += n - 1
    keys = clusters or [None] * len(engines)
    df = _cluster_df([(k, len(e) - 1) for k, e in zip(keys, engines)])
    if not n_df:
        return _Part(math.nan, df)
    return _Part(max(ss - own, 0.0) / n_df, df, ss / n_df, own / n_df)


def _cluster_df(items: list[tuple[object, int]]) -> int:
    """Degrees of freedom of (cluster key, engine's df) pairs: each cluster's largest once,
    an engine without a key (None) on its own."""
    most: dict[object, int] = {}
    for i, (key, df) in enumerate(items):
        key = ("alone", i) if key is None else key
        most[key] = max(most.get(key, 0), df)
    return sum(most.values())


def _group_of(sittings: list[tuple]) -> str | None:
    """The group an engine's sittings were measured in (their 4th field), None where not
    kept (lines written before groups were)."""
    for x in sittings:
        if len(x) > 3 and x[3]:
            return x[3]
    return None


def _occasions(sittings: list[tuple]) -> list[list[tuple]]:
    """An engine's sittings grouped by the occasion (run) that measured them, in order; a
    sitting without one (a 2-tuple, or an empty occasion) is an occasion of its own."""
    groups: dict[object, list[tuple]] = {}
    for i, x in enumerate(sittings):
        key = x[2] if len(x) > 2 and x[2] else ("alone", i)
        groups.setdefault(key, []).append(x)
    return list(groups.values())


def nested_components(engines: list[list[tuple]]) -> tuple[float, int, float, int]:
    """(within, df_within, between, df_between): the variance of a sitting's offset within
    one occasion and that of an occasion's offset shared by its sittings, from each engine's
    sittings (log figure, own sd of the log, occasion, group), method of moments (a nested
    analysis of variance, each clamped at zero).

    Within: :func:`variance_components` over each engine's occasions of two or more
    sittings. Between: the engine's occasion means about their mean, less what the
    sittings' offsets (within / n) and their own noise account for: E[sum (m_r - m)^2] =
    (R - 1) between + (1 - 1/R) sum (within / n_r + own_r). Where no occasion had two
    sittings, the within part cannot be told apart and ``between`` holds both (a sitting
    of another run moves by it whole). NaN where a part has no degrees of freedom.

    The degrees of freedom count a group once (within: a group's sittings in one
    occasion; between: its occasions), not each of its engines: a group's engines share
    a sitting's offset (the baseline every speedup divides by, the host's state), so
    that a model's ten engines read 0% between runs in one pair of runs and then moved
    3-5% together in the next (2026-11-27); 29 degrees of freedom had made that 0% the
    family's own spread."""
    within, between = _nested(engines)
    return within.var, within.df, between.var, between.df


def _nested(engines: list[list[tuple]]) -> tuple[_Part, _Part]:
    """:func:`nested_components` with the mean squares each part came from."""
    pieces = [  # (an occasion's sittings of an engine, its group in that occasion)
        (group, (key, group[0][2]) if (key := _group_of(engine)) else None)
        for engine in engines
        for group in _occasions(engine)
        if len(group) >= 2  # an occasion of two sittings has its key (the 3rd field)
    ]
    within = _within([g for g, _ in pieces], [k for _, k in pieces])
    w = within.var if within.df else 0.0
    ss = expected = 0.0
    n_df, counted = 0, []
    for engine in engines:
        groups = _occasions(engine)
        r = len(groups)
        if r < 2:
            continue
        means = [
            (sum(x[0] for x in g) / len(g), sum(x[1] ** 2 for x in g) / len(g) ** 2, len(g))
            for g in groups
        ]
        centre = sum(m for m, _, _ in means) / r
        ss += sum((m - centre) ** 2 for m, _, _ in means)
        expected += (1 - 1 / r) * sum(w / n + own for _, own, n in means)
        n_df += r - 1
        counted.append((_group_of(engine), r - 1))
    df_b = _cluster_df(counted)
    if not n_df:
        return within, _Part(math.nan, df_b)
    return within, _Part(max(ss - expected, 0.0) / n_df, df_b, ss / n_df, expected / n_df)


def wider(own: _Part, rest: _Part, alpha: float = 0.05) -> bool:
    """Whether a family's part (``own``) is wider than the other families' (``rest``):
    under the hypothesis that the family's component is the rest's, its raw mean square
    has the expectation ``rest.var + own.noise`` (its own sittings' noise beneath it), and
    the ratio of the two is F-distributed with (``own.df``, ``rest.df``) degrees of
    freedom; it is wider where the ratio lies above that law's ``1 - alpha`` quantile.
    The mean squares, not the clamped estimates, are compared: a family whose squares its
    own noise explains reads 0% and says no more than that its part is small.

    One-sided: a family that reads quieter than the rest keeps the pooled spread. Its own
    estimate is then a small component clamped at zero more often than not, and a re-run
    interval built on it is its sittings' noise alone: on 2026-11-27 the ResNet engines'
    throughputs read 0.00% within and between runs (16 and 12 df, far below the rest's
    3.96%), got intervals of +-1.7-2.2%, and the next run moved them 2-7%."""
    from scipy import stats

    if not (own.df and rest.df) or math.isnan(own.ms) or math.isnan(rest.var):
        return own.df > 0 and not rest.df  # nothing to compare with: the family's own
    expected = rest.var + own.noise
    if expected <= 0:
        return own.ms > 0
    return own.ms / expected > stats.f.ppf(1 - alpha, own.df, rest.df)


def pooled_spread(by_family: dict[str, list[list[tuple]]], family: str | None, source: str):
    """The spread between sittings of the engines ``by_family`` (each engine: its sittings'
    log figures, own sds and occasions, :func:`nested_components`), each component from
    the engines of ``family`` where they give it :data:`FAMILY_MIN_DF` degrees of freedom
    and the data says it is wider than the other families' (:func:`wider`), else from
    every engine pooled; ``None`` where neither component has :data:`MIN_DF`. (Before the
    test, a family with 10 degrees of freedom always had its own: two families read 0.00%
    between runs beside 0.37% pooled, each clamped at zero, and their re-run intervals
    left the spread between runs out.)"""
    everyone = [e for group in by_family.values() for e in group]
    own = by_family.get(family, []) if family else []
    others = [e for name, group in by_family.items() if name != family for e in group]
    mine, pooled, rest = _nested(own), _nested(everyone), _nested(others)
    parts, labels = [], []
    for i, what in ((0, "sittings"), (1, "runs")):
        if mine[i].df >= FAMILY_MIN_DF and wider(mine[i], rest[i]):
            use, label = mine[i], f"the {family} engines, wider than the rest"
            if not others:  # a history of one family: no rest to be wider than
                label = "every engine"
        else:
            use, label = pooled[i], "every engine"
        var, df = (use.var, use.df) if use.df >= MIN_DF else (0.0, 0)
        parts.append((var, df))
        if df:
            labels.append(label if what == "sittings" else f"{label}, between runs")
    (within, df_w), (between, df_b) = parts
    if not df_w and not df_b:
        return None
    sittings = sum(len(e) for e in everyone)
    return Spread(
        math.sqrt(within),
        df_w,
        f"{source} ({'; '.join(labels)}: {len(everyone)} measured in {sittings} sittings)",
        math.sqrt(between),
        df_b,
    )


def families(home, kind: str = "cpu") -> list[str]:
    """The model families this host's history holds."""
    found = set()
    base = folder(home, kind)
    for path in sorted(base.glob("*.jsonl")) if base.is_dir() else []:
        entries = _read(path)
        if entries:
            found.add(entries[-1].family or "-")
    return sorted(found)


def rerun_interval(
    value: float, h: float | None, spread: Spread | None, sittings: int = 1, confidence=0.95
):
    """(low, high, relative half-width) of the 95% interval where a re-run on this host is
    expected to land, for a figure that is the mean of ``sittings`` sittings of one run: the
    re-run's figure differs from this one by both runs' offsets (2 x
    :meth:`Spread.of_mean`'s variance: the sittings' own offsets over their number, and the
    occasion's) and both runs' own noise (this one's, twice), a Student-t prediction
    interval with the spread's degrees of freedom. ``None`` without a spread or a sitting
    interval."""
    if spread is None or h is None or not value or value <= 0:
        return None
    from scipy import stats

    one = spread.of_mean(sittings)
    q = float(stats.t.ppf(0.5 + confidence / 2, max(one.df, 1)))
    width = q * math.sqrt(2 * one.sd**2 + 2 * _log_sd(h) ** 2)
    return value * math.exp(-width), value * math.exp(width), math.expm1(width)
