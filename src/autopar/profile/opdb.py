"""The operator knowledge base: one SQLite file of measured operator, layer and collective times.

Schema version :data:`SCHEMA_VERSION` (``PRAGMA user_version``); a file written by another
version is refused rather than misread. Table ``op`` is keyed by (device, op, shape, dtype,
versions): ``shape`` is the canonical JSON of the operator's dimensions (sorted keys, e.g.
``{"k":4096,"m":8192,"n":6144}``), ``versions`` the library versions that ran it (``torch=2.13.0
cuda=12.8``). Each row holds the median forward and backward seconds over the repeats, their
spread (half the range), the bytes the operator moves, and for layers the bytes saved for
backward and the CUDA peak. Table ``comm`` holds collective samples, ``comm_fit`` their
latency-bandwidth fits per (collective, link class) with the ranks per node of the fitted groups
(version 2 added it: an inter-node fit's bus bandwidth is shared by that many NICs). Layer
profiles are ``op='layer'`` rows keyed by :func:`autopar.profile.shapes.layer_dims`. Every write
commits at once, so an interrupted profile keeps what it finished. No torch here: the planner reads the file without it.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from autopar.errors import AutoparError

SCHEMA_VERSION = 2
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
"""

# Column names per table, in order, as _SCHEMA creates them (a file with other columns is refused).
_COLUMNS = {
    "op": ("device", "op", "shape", "dtype", "versions", "fwd_s", "fwd_spread_s", "bwd_s", "bwd_spread_s", "bytes",
           "repeats", "saved_bytes", "peak_bytes", "created"),
    "comm": ("device", "collective", "link", "group_size", "bytes", "time_s", "versions", "created"),
    "comm_fit": ("device", "collective", "link", "alpha_s", "bus_bandwidth_bytes_per_s", "points", "ranks_per_node",
                 "versions", "created"),
}

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


def make_folder(path: str | Path) -> Path:
    """Create the folder of the database file ``path`` (not the file) and return ``Path(path)``.

    Raises:
        AutoparError: the folder cannot be created (e.g. under a file).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise AutoparError(f"--profile-db={str(path)!r}: cannot create its folder ({err.strerror})") from None
    return path


class OpDB:
    """An open knowledge base file (created when missing).

    Raises:
        AutoparError: the file is not SQLite or has another schema version.
    """

    def __init__(self, path: str | Path):
        self.path = make_folder(path)
        try:
            self.conn = sqlite3.connect(self.path)
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            tables = self.conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        except sqlite3.DatabaseError as err:
            raise AutoparError(f"--profile-db={str(path)!r}: not an autopar profile database ({err})") from None
        if tables and version != SCHEMA_VERSION:
            raise AutoparError(f"--profile-db={str(path)!r}: schema version {version}, this autopar reads "
                               f"{SCHEMA_VERSION}; profile again into a new file")
        try:
            self.conn.executescript(_SCHEMA)
            for table, columns in _COLUMNS.items():
                have = [r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")]
                if have != list(columns):
                    raise AutoparError(f"--profile-db={str(path)!r}: table {table} has columns {have}, schema "
                                       f"version {SCHEMA_VERSION} needs {list(columns)}; profile again into a new file")
            self.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self.conn.commit()
        except sqlite3.DatabaseError as err:
            raise AutoparError(f"--profile-db={str(path)!r}: cannot use it ({err})") from None
        self._cache: dict[tuple[str, str, str], list[tuple[dict, float, float]]] = {}

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
        where = f"--profile-db={str(self.path)!r}"
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
