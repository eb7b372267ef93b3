"""CSV input and output of the `mbfg` command line: time series with a header row.

Every reader raises `CsvError` (a `ValueError`) with a one-line message naming the file, the row and
the column, so the command line can print it and exit with status 2.

Output columns (see `state_header`): ``t``, every coordinate by name, ``<name>_dot``,
``<name>_ddot`` for every coordinate, then ``tau_<joint>`` for every actuator.
"""

from __future__ import annotations

import csv
import gzip
import math
import zlib
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np

from mbfg_ros.excerpt import excerpt, excerpts
from mbfg_ros.model.plausibility import InputLimits, Problem

__all__ = ["CsvError", "Table", "read_table", "write_table", "state_header", "state_rows", "check_time",
           "interpolate", "require_uniform_time", "median_step", "missing_cell", "sensor_columns", "check_cells"]


class CsvError(ValueError):
    """A problem with a CSV file given on the command line."""


@dataclass
class Table:
    """A parsed CSV time series: `t` (N,), `columns` (names, without `t`), `data` (N, len(columns)),
    NaN where a cell was empty."""
    source: str
    t: np.ndarray
    columns: List[str]
    data: np.ndarray

    def column(self, name: str) -> np.ndarray:
        return self.data[:, self.columns.index(name)]

    def has(self, name: str) -> bool:
        return name in self.columns

    def select(self, columns: Dict[str, str], what: str) -> "Table":
        """The table of the named columns only, each under its new name: `columns` maps a name (a sensor's, an
        actuator's: `what` says which) to the column holding it; CsvError naming a column the file lacks."""
        missing = [(name, col) for name, col in columns.items() if col not in self.columns]
        if missing:
            raise CsvError(f"{self.source}: no column {', '.join(repr(excerpt(c)) for _, c in missing)} (for "
                           f"{what} {', '.join(name for name, _ in missing)}; columns: {excerpts(self.columns)})")
        return Table(self.source, self.t, list(columns),
                     self.data[:, [self.columns.index(col) for col in columns.values()]].copy())


def read_table(path, time_column: Optional[str] = None) -> Table:
    """Read a CSV file (gzip-compressed where its name ends in ``.gz``) with a header row whose first column is
    ``t`` (seconds, strictly increasing), or with a column named `time_column` anywhere in the header.

    Cells must be numbers; an empty cell or ``nan`` (any case: numpy's and pandas' spelling) is a missing
    value (NaN in `data`; what it means is up to the reader: a missing reading, an unknown command), ``inf``
    is an error.  The time column must have every cell.  Lines starting with ``#`` are comments.
    """
    source = str(path)
    try:
        opened = gzip.open(path, "rt", newline="", encoding="utf-8-sig") if source.endswith(".gz") else \
            open(path, newline="", encoding="utf-8-sig")
        with opened as f:
            lines = [row for row in csv.reader(line for line in f if not line.lstrip().startswith("#"))]
    except gzip.BadGzipFile:
        raise CsvError(f"{source}: not a gzip-compressed file (its name ends in .gz)") from None
    except OSError as exc:
        raise CsvError(f"{source}: cannot read file: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, csv.Error, EOFError, zlib.error) as exc:
        raise CsvError(f"{source}: not a readable CSV file ({excerpt(exc, 120)})") from None
    lines = [row for row in lines if any(cell.strip() for cell in row)]
    if not lines:
        raise CsvError(f"{source}: the file is empty (expected a header row starting with '{time_column or 't'}')")
    header = [h.strip() for h in lines[0]]
    if time_column is None:
        if not header or header[0] != "t":
            raise CsvError(f"{source}: the first column of the header must be 't' (got "
                           f"'{excerpt(header[0]) if header else ''}'; another time column: --time-column NAME)")
        when = 0
    elif time_column in header:
        when = header.index(time_column)
    else:
        raise CsvError(f"{source}: no time column '{excerpt(time_column)}' in the header (columns: "
                       f"{excerpts(header)})")
    if any(not h for h in header):
        raise CsvError(f"{source}: header has an empty column name (column {header.index('') + 1})")
    dup = sorted({h for h in header if header.count(h) > 1})
    if dup:
        raise CsvError(f"{source}: duplicate column(s) in the header: {excerpts(dup)}")
    rows = lines[1:]
    if not rows:
        raise CsvError(f"{source}: no data rows after the header")
    data = np.empty((len(rows), len(header)))
    for i, row in enumerate(rows):
        line_no = i + 2
        if len(row) != len(header):
            raise CsvError(f"{source}: row {line_no} has {len(row)} cells, the header has {len(header)}")
        for j, cell in enumerate(row):
            data[i, j] = _cell(source, line_no, header[j], cell.strip(), time=j == when)
    t = data[:, when].copy()
    check_time(source, t)
    rest = [j for j in range(len(header)) if j != when]
    return Table(source, t, [header[j] for j in rest], data[:, rest].copy())


def _cell(source: str, line_no: int, column: str, cell: str, time: bool) -> float:
    """The value of one cell: NaN for a missing one (empty or 'nan'), else a finite number or CsvError."""
    where = f"{source}: row {line_no}, column '{excerpt(column)}'"
    missing = not cell or cell.lower().lstrip("+-") == "nan"
    if missing:
        if time:
            raise CsvError(f"{where}: the time is missing ('{excerpt(cell)}'): every row needs its time")
        return math.nan
    try:
        x = float(cell)
    except ValueError:
        raise CsvError(f"{where}: not a number: '{excerpt(cell)}'") from None
    if not math.isfinite(x):
        raise CsvError(f"{where}: not a finite number: '{excerpt(cell)}' (a missing value is an empty cell or nan)")
    return x


def check_time(source: str, t: np.ndarray) -> None:
    """CsvError naming the first row whose time repeats the previous row's or goes back from it (file rows
    are counted from 1, the header included)."""
    if len(t) < 2:
        return
    steps = np.diff(t)
    bad = np.nonzero(steps <= 0)[0]
    if bad.size:
        i = int(bad[0])
        this, before = i + 3, i + 2
        if steps[i] == 0:
            raise CsvError(f"{source}: row {this}: time t = {t[i + 1]:.9g} s repeats row {before}'s "
                           f"(times must be strictly increasing)")
        raise CsvError(f"{source}: row {this}: time goes backwards (t = {t[i + 1]:.9g} s after "
                       f"{t[i]:.9g} s at row {before}; times must be strictly increasing)")


def require_uniform_time(table: Table, rel_tol: float = 1e-6) -> float:
    """The constant step of `table.t` (at least 2 rows), or CsvError."""
    if len(table.t) < 2:
        raise CsvError(f"{table.source}: need at least 2 rows to define a time step")
    dts = np.diff(table.t)
    dt = float(np.mean(dts))
    if np.max(np.abs(dts - dt)) > rel_tol * max(dt, 1e-12) + 1e-12:
        i = int(np.argmax(np.abs(dts - dt)))
        raise CsvError(f"{table.source}: time steps must be uniform (mean {dt:g} s, but the step from row "
                       f"{i + 2} to row {i + 3} is {dts[i]:g} s)")
    return dt


def median_step(table: Table) -> float:
    """The median interval between the rows' times (at least 2 rows): the step of a recording whose time
    stamps jitter or drift (one late sample moves it by nothing)."""
    if len(table.t) < 2:
        raise CsvError(f"{table.source}: need at least 2 rows to define a time step")
    return float(np.median(np.diff(table.t)))


def missing_cell(table: Table, names: Sequence[str]) -> Optional[str]:
    """"row R, column 'C'" of the first missing cell (by row, then by the order of `names`), or None."""
    if not names:
        return None
    bad = ~np.isfinite(np.column_stack([table.column(name) for name in names]))
    if not bad.any():
        return None
    i, j = np.argwhere(bad)[0]
    return f"row {int(i) + 2}, column '{names[int(j)]}'"


def interpolate(table: Table, names: Sequence[str], t: np.ndarray) -> np.ndarray:
    """Columns `names` linearly interpolated at times `t` (held constant outside the table), (len(t), len(names))."""
    out = np.empty((len(t), len(names)))
    for j, name in enumerate(names):
        y = table.column(name)
        ok = np.isfinite(y)
        if not ok.any():
            raise CsvError(f"{table.source}: column '{excerpt(name)}' has no values")
        out[:, j] = np.interp(t, table.t[ok], y[ok])
    return out


def state_header(coordinate_names: Sequence[str], actuator_names: Sequence[str]) -> List[str]:
    names = list(coordinate_names)
    return (["t"] + names + [f"{c}_dot" for c in names] + [f"{c}_ddot" for c in names]
            + [f"tau_{a}" for a in actuator_names])


def state_rows(t, q, v, a, tau) -> np.ndarray:
    """Stack per-step arrays into rows matching `state_header`."""
    t = np.asarray(t, dtype=float).reshape(-1, 1)
    tau = np.asarray(tau, dtype=float).reshape(len(t), -1)
    return np.hstack([t, np.asarray(q).reshape(len(t), -1), np.asarray(v).reshape(len(t), -1),
                      np.asarray(a).reshape(len(t), -1), tau])


def write_table(path, header: Sequence[str], rows: Iterable[Sequence[float]], precision: int = 12) -> None:
    """Write a CSV file (``%.{precision}g`` numbers, NaN as an empty cell)."""
    fmt = f"%.{precision}g"
    try:
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(list(header))
            for row in rows:
                w.writerow(["" if not math.isfinite(x) else fmt % x for x in row])
    except OSError as exc:
        raise CsvError(f"{path}: cannot write file: {exc.strerror or exc}") from None


def sensor_columns(table: Table, limits: InputLimits) -> Dict[str, np.ndarray]:
    """Columns of `table` that are sensor names (`limits.sensor_names`); an unknown column or an
    implausible reading (`limits.reading_problem`, no estimate yet) is an error."""
    sensor_names = limits.sensor_names
    unknown = [c for c in table.columns if c not in sensor_names]
    if unknown:
        raise CsvError(f"{table.source}: unknown sensor column(s) {excerpts(unknown)} "
                       f"(sensors: {', '.join(sensor_names) or 'none'}; a logger's own names: --reading SENSOR=COLUMN)")
    for c in table.columns:
        check_cells(table, c, lambda value, name=c: limits.reading_problem(name, value))
    return {c: table.column(c) for c in table.columns}


def check_cells(table: Table, column: str, check: Callable[[float], Optional[Problem]]) -> None:
    """CsvError naming the row and column of the first non-empty cell of `column` that `check(value)`
    refuses (it returns a `(kind, detail)` problem of `model.plausibility`, None if the value is fine)."""
    for i, value in enumerate(table.column(column).tolist()):
        if math.isfinite(value):              # empty cells are NaN: a missing value, judged by the reader
            problem = check(value)
            if problem is not None:
                kind, detail = problem
                raise CsvError(f"{table.source}: row {i + 2}, column '{excerpt(column)}': {kind.replace('_', ' ')}: {detail}")

