"""The operator knowledge base: one SQLite file of measured operator, layer and collective times.

Schema version :data:`SCHEMA_VERSION` (``PRAGMA user_version``). Table ``op`` is keyed by
(device, op, shape, dtype, versions): ``device`` the name torch reported, ``shape`` the
canonical JSON of the operator's dimensions (sorted keys, e.g. ``{"k":4096,"m":8192,"n":6144}``),
``dtype`` the precision it ran in, ``versions`` the library versions that ran it (``torch=2.13.0
cuda=12.8``). Each row holds the median forward and backward seconds over the repeats, their
spread (half the range), the bytes the operator moves, and for layers the bytes saved for
backward and the CUDA peak. Table ``comm`` holds collective samples, ``comm_fit`` their
latency-bandwidth fits per (collective, link class) with the ranks per node of the fitted groups
(version 2 added it: an inter-node fit's bus bandwidth is shared by that many NICs). Table
``measured_on`` (version 3) records per (device, versions) where and with what the rows were
measured (:class:`autopar.profile.provenance.MeasuredOn`). Table ``run`` (version 4) holds the
short training runs of ``autopar verify --record`` (problem, layout, measured step time and peak
memory, or the failure and its cause) and ``calibration`` the efficiency multipliers
``autopar calibrate`` fitted to them (:mod:`autopar.verify.calibrate`). Layer profiles are ``op='layer'``
rows keyed by :func:`autopar.profile.shapes.layer_dims`. Every write commits at once, so an
interrupted profile keeps what it finished. No torch here: the planner reads the file without it.

Older files: version 3 lacks ``run`` and ``calibration`` (read as holding no runs; created
when a profile or verify command writes to it). Version 2 lacks ``measured_on`` but holds what it records (its rows are keyed by
the name torch reported and its ``versions`` name torch and CUDA), so it is read with records
derived from its rows (:func:`autopar.profile.provenance.from_schema2`; the autopar version and
the ``--device`` given stay unknown) and migrated in place when a profile command writes to it;
version 1 (no ranks per node in ``comm_fit``) and newer versions are refused.
"""

from __future__ import annotations

import errno
import json
import math
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from autopar.errors import AutoparError
from autopar.profile.provenance import MeasuredOn, from_schema2

SCHEMA_VERSION = 4
MIGRATES = (2, 3)  # older versions read (and migrated on write) without profiling again
_NEW_IN_4 = ("run", "calibration")
NEIGHBOURHOOD = 2.0  # interpolate only between shapes whose every dimension is within 2x
MAX_OP_S = 3600.0  # one operator or layer call: an hour is no measurement, a corrupt row

_SCHEMA = """
CREATE TABLE IF NOT EXISTS op (
  device TEXT NOT NULL, op TEXT NOT NULL, shape TEXT NOT NULL, dtype TEXT NOT NULL, versions TEXT NOT NULL,
  fwd_s REAL NOT NULL, fwd_spread_s REAL NOT NULL, bwd_s REAL NOT NULL, bwd_spread_s REAL NOT NULL,
  bytes REAL NOT NULL, repeats INTEGER NOT NULL, saved_bytes REAL, peak_bytes REAL, created REAL NOT NULL,
  PRIMARY KEY (device, op, shape, dtype, versions));
CREATE TABLE IF NOT EXISTS comm (
  device TEXT NOT NULL, collective TEXT NOT NULL, link TEXT NOT NULL, group_size INTEGER NOT NULL,
  bytes REAL NOT NULL, time_s REAL NOT NULL, versions TEXT NOT NULL, created REAL NOT NULL,
  PRIMARY KEY (device, collective, link, group_size, bytes, versions));
CREATE TABLE IF NOT EXISTS comm_fit (
  device TEXT NOT NULL, collective TEXT NOT NULL, link TEXT NOT NULL, alpha_s REAL NOT NULL,
  bus_bandwidth_bytes_per_s REAL NOT NULL, points INTEGER NOT NULL, ranks_per_node INTEGER NOT NULL,
  versions TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (device, collective, link, versions));
CREATE TABLE IF NOT EXISTS measured_on (
  device TEXT NOT NULL, versions TEXT NOT NULL, torch_name TEXT NOT NULL, preset TEXT, given_device TEXT,
  torch_version TEXT, cuda_version TEXT, rocm_version TEXT, autopar_version TEXT, record TEXT NOT NULL,
  created REAL NOT NULL, PRIMARY KEY (device, versions));
CREATE TABLE IF NOT EXISTS run (
  device TEXT NOT NULL, framework TEXT NOT NULL, problem TEXT NOT NULL, layout TEXT NOT NULL,
  step_time_s REAL, tokens_per_s REAL, peak_allocated_bytes REAL, peak_reserved_bytes REAL, failure TEXT,
  cause TEXT, job TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (device, framework, job, created));
CREATE TABLE IF NOT EXISTS calibration (
  device TEXT NOT NULL, framework TEXT NOT NULL, factor TEXT NOT NULL, multiplier REAL NOT NULL,
  runs INTEGER NOT NULL, applied INTEGER NOT NULL, created REAL NOT NULL, PRIMARY KEY (device, framework, factor));
"""

# Column names per table, in order, as _SCHEMA creates them (a file with other columns is refused).
_COLUMNS = {
    "op": ("device", "op", "shape", "dtype", "versions", "fwd_s", "fwd_spread_s", "bwd_s", "bwd_spread_s", "bytes",
           "repeats", "saved_bytes", "peak_bytes", "created"),
    "comm": ("device", "collective", "link", "group_size", "bytes", "time_s", "versions", "created"),
    "comm_fit": ("device", "collective", "link", "alpha_s", "bus_bandwidth_bytes_per_s", "points", "ranks_per_node",
                 "versions", "created"),
    "measured_on": ("device", "versions", "torch_name", "preset", "given_device", "torch_version", "cuda_version",
                    "rocm_version", "autopar_version", "record", "created"),
    "run": ("device", "framework", "problem", "layout", "step_time_s", "tokens_per_s", "peak_allocated_bytes",
            "peak_reserved_bytes", "failure", "cause", "job", "created"),
    "calibration": ("device", "framework", "factor", "multiplier", "runs", "applied", "created"),
}
_RECORD_FIELDS = _COLUMNS["measured_on"][:-1]  # MeasuredOn's fields, in order

# Work of one call, for interpolating between shapes (FLOPs up to a constant, or elements).
WORK = {
    "gemm": lambda d: d["m"] * d["n"] * d["k"],
    "grouped_gemm": lambda d: d["g"] * d["m"] * d["n"] * d["k"],
    "attention": lambda d: d["b"] * d["s"] ** 2 * d["hq"] * (d["d"] + d["dv"]),
    "rmsnorm": lambda d: d["rows"] * d["h"],
    "layernorm": lambda d: d["rows"] * d["h"],
    "add": lambda d: d["rows"] * d["h"],
    "rope": lambda d: d["rows"] * (d["hq"] + d["hkv"]) * d["d"],
    "swiglu": lambda d: d["rows"] * d["f"],
    "gelu": lambda d: d["rows"] * d["f"],
    "cross_entropy": lambda d: d["rows"] * d["v"],
}


def shape_key(dims: dict) -> str:
    """Canonical text of an operator's dimensions (the ``shape`` column)."""
    return json.dumps(dims, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class OpTime:
    """Forward and backward seconds of one call; ``exact`` False when interpolated."""

    fwd_s: float
    bwd_s: float
    exact: bool


FILL_WITH_OPS = "fill it with 'autopar profile ops'"
#: How a database of runs comes about (``autopar calibrate --db``): verify stores its runs there.
FILL_WITH_RUNS = "store runs in it with 'autopar verify ... --record FILE'"


def _readable(path: Path, option: str, fill: str = FILL_WITH_OPS) -> None:
    """Raises AutoparError (naming ``option``) unless ``path`` is an existing regular file (a name
    longer than the file system allows included: ``Path.is_dir`` raised ``OSError``); a missing
    file's message ends with ``fill``, how to create it."""
    try:
        os.stat(path)
    except OSError as err:
        if err.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            raise AutoparError(f"{option}={str(path)!r}: cannot read ({err.strerror})") from None
    if path.is_dir():
        raise AutoparError(f"{option}={str(path)!r}: is a directory, not a profile database file")
    if path.is_symlink() and not path.exists():
        raise AutoparError(f"{option}={str(path)!r}: a symbolic link to nothing (or a loop), not a profile database "
                           "file")
    if not path.exists():
        raise AutoparError(f"{option}={str(path)!r}: no such file ({fill})")
    if not path.is_file():
        raise AutoparError(f"{option}={str(path)!r}: not a regular file, so not a profile database file")


def make_folder(path: str | Path, option: str = "--profile-db") -> Path:
    """Create the folder of the database file ``path`` (not the file) and return ``Path(path)``.

    Raises:
        AutoparError: ``path`` is an existing directory or other non-file, or its folder cannot
            be created (e.g. under a file); names ``option``.
    """
    path = Path(path)
    if path.exists():
        _readable(path, option)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        blocker = next((a for a in path.parents if a.exists() or a.is_symlink()), None)
        why = f"{str(blocker)!r} is not a folder" if blocker is not None and not blocker.is_dir() else err.strerror
        raise AutoparError(f"{option}={str(path)!r}: cannot create its folder ({why})") from None
    return path


SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite 3 file (sqlite.org/fileformat.html, 1.3)


def _refuse_not_sqlite(path: Path, where: str) -> None:
    """Refuse an existing non-empty file that does not start with :data:`SQLITE_HEADER`.

    SQLite itself takes a file shorter than its 100-byte header as an empty database: a 1-byte
    file read as "holds no measurements yet" and, opened for writing, was replaced by a new
    database. An empty (0-byte) file is an empty database, as SQLite creates it.

    Raises:
        AutoparError: ``--db='x': not an autopar profile database (not an SQLite file: ...)``.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError:
        return  # missing or unreadable: the callers' own checks name it
    if head and head != SQLITE_HEADER:
        raise AutoparError(f"{where}: not an autopar profile database (not an SQLite file: it starts with {head!r}, "
                           f"not {SQLITE_HEADER!r})")


def refuse_unusable_db(path: str | Path, option: str) -> None:
    """Check, before any work, that :class:`OpDB` will open ``path`` for writing, without
    creating or changing anything: an existing file must be an autopar profile database (empty
    or not); a missing one needs a folder that exists or can be created.

    ``verify --record`` stores its runs after they ran: a file refused only then cost the runs.

    Raises:
        AutoparError: as :class:`OpDB` and :func:`make_folder` would, naming ``option``.
    """
    path = Path(path)
    if path.exists() or path.is_symlink():
        OpDB(path, option, write=False, empty_ok=True).close()
        return
    blocker = next((a for a in path.parents if a.exists() or a.is_symlink()), None)
    if blocker is not None and not blocker.is_dir():
        raise AutoparError(f"{option}={str(path)!r}: cannot create its folder ({str(blocker)!r} is not a folder)")
    if blocker is not None and not os.access(blocker, os.W_OK | os.X_OK):
        raise AutoparError(f"{option}={str(path)!r}: cannot create it (no write permission in {str(blocker)!r})")


class OpDB:
    """An open knowledge base file: read-only (``write=False``, what ``search``/``estimate``
    open: the file must exist and is never changed), or for a profile command (created when
    missing; a version-2 file is migrated in place). ``option`` is the command-line option
    that named the file, for the messages; ``fill`` says how such a file is made, for the
    messages about a missing or empty one (default: ``autopar profile ops``;
    :data:`FILL_WITH_RUNS` for the runs ``calibrate`` reads); ``empty_ok`` (read-only) accepts a
    file holding no tables yet (:func:`refuse_unusable_db`).

    Raises:
        AutoparError: a directory or missing file (read-only), not SQLite (a non-empty file
            without the SQLite header included), a version other than
            :data:`SCHEMA_VERSION` and :data:`MIGRATES`, or tables with other columns.
    """

    def __init__(self, path: str | Path, option: str = "--profile-db", write: bool = True, fill: str = FILL_WITH_OPS,
                 empty_ok: bool = False):
        self.option = option
        where = f"{option}={str(path)!r}"
        if write:
            self.path = make_folder(path, option)
        else:
            self.path = Path(path)
            _readable(self.path, option, fill)
        _refuse_not_sqlite(self.path, where)
        try:
            if write:
                self.conn = sqlite3.connect(self.path)
            else:
                self.conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            tables = self.conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        except sqlite3.DatabaseError as err:
            raise AutoparError(f"{where}: not an autopar profile database ({err})") from None
        if tables and version not in (SCHEMA_VERSION, *MIGRATES):
            raise AutoparError(f"{where}: schema version {version}, this autopar reads {SCHEMA_VERSION} (and "
                               f"migrates {', '.join(map(str, MIGRATES))}); profile again into a new file (autopar profile ops --db "
                               "NEW.db ...)")
        self.schema = version if tables else SCHEMA_VERSION
        if not tables and not write and not empty_ok:
            raise AutoparError(f"{where}: holds no measurements yet ({fill})")
        try:
            if tables:
                self._check_columns(where)  # before any write: a refused file stays as it was
            if write:
                self.conn.executescript(_SCHEMA)
                if self.schema == 2:
                    self._migrate()
                self.schema = SCHEMA_VERSION
                self.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                self.conn.commit()
        except sqlite3.DatabaseError as err:
            raise AutoparError(f"{where}: cannot use it ({err})") from None
        self._cache: dict[tuple[str, str, str], list[tuple[dict, float, float]]] = {}

    def _check_columns(self, where: str) -> None:
        """Raises AutoparError when a table of this file's schema has other columns."""
        for table, columns in _COLUMNS.items():
            if table == "measured_on" and self.schema == 2 and not self._has_table("measured_on"):
                continue  # a version-2 file read as it is: records derived from its rows
            if table in _NEW_IN_4 and self.schema < 4 and not self._has_table(table):
                continue  # a version-2/3 file read as it is: no runs
            have = [r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")]
            if have != list(columns):
                raise AutoparError(f"{where}: table {table} has columns {have}, schema version {SCHEMA_VERSION} "
                                   f"needs {list(columns)}; profile again into a new file")

    def _has_table(self, table: str) -> bool:
        return self.conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)).fetchone() \
            is not None

    def _keys(self) -> list[tuple[str, str]]:
        """Every (device, versions) key of the operator, sample and fit rows."""
        return list(self.conn.execute("SELECT device, versions FROM op UNION SELECT device, versions FROM comm "
                                      "UNION SELECT device, versions FROM comm_fit ORDER BY 1, 2"))

    def _migrate(self) -> None:
        """Version 2 -> 3: a ``measured_on`` record derived from each key of the rows (3 -> 4 only
        creates the new tables)."""
        for device, versions in self._keys():
            self.put_measured_on(from_schema2(device, versions), commit=False)

    def close(self) -> None:
        self.conn.close()

    def check(self, device: str) -> None:
        """Refuse rows of ``device`` that no measurement can produce, before they reach the cost
        model: times outside (0, :data:`MAX_OP_S`) (``log`` interpolation), shapes that are not a JSON object
        of dimensions (positive for the operators of :data:`WORK`), collective fits with latency
        < 0 or bus bandwidth <= 0.

        Raises:
            AutoparError: names the first bad row (op, shape, value) and what is allowed.
        """
        where = f"{self.option}={str(self.path)!r}"
        for op, shape, fwd, bwd in self.conn.execute(
                "SELECT op, shape, fwd_s, bwd_s FROM op WHERE device=?", (device,)):
            try:
                dims = json.loads(shape)
            except ValueError:
                dims = None
            positive = op not in WORK or all(isinstance(v, (int, float)) and v > 0 for v in dims.values()) \
                if isinstance(dims, dict) else False
            if not positive:
                raise AutoparError(f"{where}: op {op} shape={shape!r}: expected a JSON object of dimensions (> 0 for "
                                   "the interpolated operators)")
            for name, value in (("fwd_s", fwd), ("bwd_s", bwd)):
                if not isinstance(value, (int, float)) or not 0 < value < MAX_OP_S:
                    raise AutoparError(f"{where}: op {op} {shape} {name}={value!r}: a measured time must be in "
                                       f"(0, {MAX_OP_S:g}) s")
        for coll, link, alpha, bw, ranks in self.conn.execute(
                "SELECT collective, link, alpha_s, bus_bandwidth_bytes_per_s, ranks_per_node FROM comm_fit "
                "WHERE device=?", (device,)):
            if not (isinstance(alpha, (int, float)) and 0 <= alpha < math.inf and isinstance(bw, (int, float))
                    and 0 < bw < math.inf and isinstance(ranks, int) and ranks >= 1):
                raise AutoparError(f"{where}: comm_fit {coll} {link} alpha_s={alpha!r} bus_bandwidth_bytes_per_s="
                                   f"{bw!r} ranks_per_node={ranks!r}: needs latency >= 0 s, bandwidth > 0 B/s and "
                                   ">= 1 rank per node, all finite")

    def put_measured_on(self, rec: MeasuredOn, commit: bool = True) -> None:
        """Record where and with what the rows keyed (``rec.device``, ``rec.versions``) are measured."""
        self.conn.execute("INSERT OR REPLACE INTO measured_on VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                          (*(getattr(rec, f) for f in _RECORD_FIELDS), time.time()))
        if commit:
            self.conn.commit()

    def measured_on(self, device: str) -> tuple[list[MeasuredOn], list[str]]:
        """(the records of ``device``'s rows, the ``versions`` of its rows that have none).

        A version-2 file read as it is has no records: each is derived from its rows
        (:func:`autopar.profile.provenance.from_schema2`)."""
        keys = [v for d, v in self._keys() if d == device]
        if self.schema == 2:
            return [from_schema2(device, v) for v in keys], []
        cur = self.conn.execute(f"SELECT {', '.join(_RECORD_FIELDS)} FROM measured_on WHERE device=? ORDER BY versions",
                                (device,))
        records = [MeasuredOn(*row) for row in cur]
        have = {r.versions for r in records}
        return records, [v for v in keys if v not in have]

    def dtypes(self, device: str) -> dict[str, int]:
        """Operator and layer rows of ``device`` per precision (``dtype``)."""
        return dict(self.conn.execute("SELECT dtype, count(*) FROM op WHERE device=? GROUP BY dtype ORDER BY dtype",
                                      (device,)))

    def devices(self) -> list[str]:
        """Device names with at least one operator, layer or collective-fit row."""
        return [r[0] for r in self.conn.execute("SELECT device FROM op UNION SELECT device FROM comm_fit ORDER BY 1")]

    def has(self, device: str, op: str, dims: dict, dtype: str, versions: str) -> bool:
        row = self.conn.execute("SELECT 1 FROM op WHERE device=? AND op=? AND shape=? AND dtype=? AND versions=?",
                                (device, op, shape_key(dims), dtype, versions)).fetchone()
        return row is not None

    def put(self, device: str, op: str, dims: dict, dtype: str, versions: str, fwd: tuple[float, float],
            bwd: tuple[float, float], num_bytes: float, repeats: int, saved_bytes: float | None = None,
            peak_bytes: float | None = None) -> None:
        """Insert or replace one measurement and commit. ``fwd``/``bwd``: (median, spread) s."""
        self.conn.execute("INSERT OR REPLACE INTO op VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                          (device, op, shape_key(dims), dtype, versions, fwd[0], fwd[1], bwd[0], bwd[1],
                           num_bytes, repeats, saved_bytes, peak_bytes, time.time()))
        self.conn.commit()
        self._cache.pop((device, op, dtype), None)

    def rows(self, device: str, op: str, dtype: str) -> list[tuple[dict, float, float]]:
        """(dims, fwd_s, bwd_s) of every measured shape, the newest per shape across versions."""
        key = (device, op, dtype)
        if key not in self._cache:
            cur = self.conn.execute("SELECT shape, fwd_s, bwd_s FROM op WHERE device=? AND op=? AND dtype=? "
                                    "ORDER BY created", key)
            newest = {shape: (json.loads(shape), f, b) for shape, f, b in cur}
            self._cache[key] = list(newest.values())
        return self._cache[key]

    def lookup(self, device: str, op: str, dims: dict, dtype: str) -> OpTime | None:
        """The measured time of ``dims``, or a log-log interpolation in the op's work between the
        nearest measured shapes below and above it whose dimensions are all within
        :data:`NEIGHBOURHOOD`; None when neither exists (the caller uses the analytic model)."""
        rows = self.rows(device, op, dtype)
        for d, f, b in rows:
            if d == dims:
                return OpTime(f, b, True)
        if op not in WORK:
            return None
        work = math.log(WORK[op](dims))
        near = [(math.log(WORK[op](d)), f, b) for d, f, b in rows
                if d.keys() == dims.keys() and all(1 / NEIGHBOURHOOD <= d[k] / dims[k] <= NEIGHBOURHOOD for k in d)]
        below = max((r for r in near if r[0] <= work), default=None)
        above = min((r for r in near if r[0] >= work), default=None)
        if below is None or above is None or below[0] == above[0]:
            return None
        w = (work - below[0]) / (above[0] - below[0])

        def interp(lo: float, hi: float) -> float:
            return math.exp(math.log(lo) + w * (math.log(hi) - math.log(lo)))

        return OpTime(interp(below[1], above[1]), interp(below[2], above[2]), False)

    def put_comm(self, device: str, collective: str, link: str, group_size: int, num_bytes: float, time_s: float,
                 versions: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO comm VALUES (?,?,?,?,?,?,?,?)",
                          (device, collective, link, group_size, num_bytes, time_s, versions, time.time()))
        self.conn.commit()

    def comm_samples(self, device: str) -> list[tuple[str, str, int, float, float]]:
        """(collective, link, group size, bytes, seconds) of every sample of ``device``."""
        return list(self.conn.execute("SELECT collective, link, group_size, bytes, time_s FROM comm WHERE device=?",
                                      (device,)))

    def put_comm_fit(self, device: str, collective: str, link: str, alpha_s: float, bus_bw: float, points: int,
                     ranks_per_node: int, versions: str) -> None:
        """Store one latency-bandwidth fit (``alpha_s`` s per step, ``bus_bw`` bytes/s) of
        ``collective`` over ``link`` (``intra`` or ``inter``) from groups of ``ranks_per_node``
        ranks per node, and commit."""
        self.conn.execute("INSERT OR REPLACE INTO comm_fit VALUES (?,?,?,?,?,?,?,?,?)",
                          (device, collective, link, alpha_s, bus_bw, points, ranks_per_node, versions, time.time()))
        self.conn.commit()

    def comm_fits(self, device: str) -> dict[tuple[str, str], tuple[float, float, int]]:
        """{(collective, link): (alpha_s, bus bandwidth bytes/s, ranks per node)}, the newest fit
        of each across library versions."""
        cur = self.conn.execute("SELECT collective, link, alpha_s, bus_bandwidth_bytes_per_s, ranks_per_node "
                                "FROM comm_fit WHERE device=? ORDER BY created", (device,))
        return {(c, link): (a, bw, r) for c, link, a, bw, r in cur}

    def put_run(self, device: str, framework: str, problem: str, layout: str, measured: dict, job: str) -> None:
        """Store one short run of ``autopar verify`` and commit. ``problem``/``layout``: JSON
        texts; ``measured``: :class:`autopar.verify.logs.RunResult` fields (seconds, bytes)."""
        self.conn.execute("INSERT OR REPLACE INTO run VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                          (device, framework, problem, layout, measured.get("step_time_s"),
                           measured.get("tokens_per_s"), measured.get("peak_allocated_bytes"),
                           measured.get("peak_reserved_bytes"), measured.get("failure"), measured.get("cause"), job,
                           time.time()))
        self.conn.commit()

    def runs(self, device: str | None = None) -> list[dict]:
        """The stored runs (of ``device``, else all), oldest first, as dicts of the ``run`` columns."""
        if not self._has_table("run"):
            return []
        where, args = ("WHERE device=?", (device,)) if device else ("", ())
        cur = self.conn.execute(f"SELECT * FROM run {where} ORDER BY created", args)
        return [dict(zip(_COLUMNS["run"], row)) for row in cur]

    def put_calibration(self, device: str, framework: str, factors: dict[str, tuple[float, int, bool]]) -> None:
        """Replace the calibration of (``device``, ``framework``): factor -> (efficiency
        multiplier, runs behind it, applied)."""
        self.conn.execute("DELETE FROM calibration WHERE device=? AND framework=?", (device, framework))
        now = time.time()
        self.conn.executemany("INSERT INTO calibration VALUES (?,?,?,?,?,?,?)",
                              [(device, framework, f, m, n, int(ok), now) for f, (m, n, ok) in factors.items()])
        self.conn.commit()

    def calibration(self, device: str, framework: str) -> dict[str, tuple[float, int, bool]]:
        """factor -> (efficiency multiplier, runs, applied) of (``device``, ``framework``); {} when none."""
        if not self._has_table("calibration"):
            return {}
        cur = self.conn.execute("SELECT factor, multiplier, runs, applied FROM calibration WHERE device=? AND "
                                "framework=?", (device, framework))
        return {f: (m, n, bool(a)) for f, m, n, a in cur}
