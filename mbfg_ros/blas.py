"""Thread count of the process's OpenBLAS libraries (numpy's and scipy's).

The linear algebra of this package is on matrices of a few dozen rows (one estimator step) or a long
chain of such blocks (the banded Cholesky of the batch engine), where waking BLAS worker threads costs
far more than the arithmetic.  `limit_blas_threads` sets the count for the process (the estimator),
`single_threaded_blas` for the duration of a block (the batch engine, restoring the previous count)."""

from __future__ import annotations

import ctypes
from contextlib import contextmanager
from typing import Callable, List, Optional, Tuple

_Setter = Callable[[int], None]
_Getter = Callable[[], int]
_found: Optional[List[Tuple[_Setter, Optional[_Getter]]]] = None

_PREFIXES = ("scipy_openblas", "openblas")
_SUFFIXES = ("64_", "")


def _loaded_libraries() -> List[Tuple[_Setter, Optional[_Getter]]]:
    """(set_num_threads, get_num_threads or None) of every OpenBLAS mapped into this process, looked up
    once: the libraries are loaded with numpy/scipy at import and never unloaded."""
    global _found
    if _found is not None:
        return _found
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and ".so" in line}
    except OSError:
        paths = set()
    found = []
    for path in sorted(paths):
        if not path.startswith("/"):
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in _PREFIXES:
            setter = next((getattr(lib, f"{prefix}_set_num_threads{s}") for s in _SUFFIXES
                           if hasattr(lib, f"{prefix}_set_num_threads{s}")), None)
            if setter is None:
                continue
            setter.argtypes = [ctypes.c_int]
            getter = next((getattr(lib, f"{prefix}_get_num_threads{s}") for s in _SUFFIXES
                           if hasattr(lib, f"{prefix}_get_num_threads{s}")), None)
            if getter is not None:
                getter.restype = ctypes.c_int
            found.append((setter, getter))
            break
    _found = found
    return found


def limit_blas_threads(n: int = 1) -> int:
    """Set the thread count of every OpenBLAS loaded in this process (numpy's and scipy's).

    Returns how many libraries were set (0 where unsupported)."""
    libs = _loaded_libraries()
    for setter, _ in libs:
        setter(int(n))
    return len(libs)


def blas_thread_counts() -> List[int]:
    """The current thread count of every OpenBLAS loaded in this process that reports it."""
    return [int(getter()) for _, getter in _loaded_libraries() if getter is not None]


@contextmanager
def single_threaded_blas():
    """Run OpenBLAS single-threaded inside the block and restore the previous thread counts after it."""
    saved = []
    for setter, getter in _loaded_libraries():
        if getter is not None:
            saved.append((setter, int(getter())))
            setter(1)
    try:
        yield
    finally:
        for setter, n in saved:
            setter(n)
