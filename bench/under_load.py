"""Run a command (by default `make test`) several times while CPU-burning processes keep the machine busy.

    python bench/under_load.py                          # `make test` 3 times beside 2 burners
    python bench/under_load.py --repeat 20 -- .venv/bin/python -m pytest -q test/test_node.py::test_stock_executor_fallback
    python bench/under_load.py --burners 0 --repeat 5 -- make test      # the same without the extra load

Each burner is a Python process spinning `while True: pass` (one core each while it runs).  The burners
start before the first run and stop after the last; they also stop on their own when this script dies
(they watch their parent) and after `--max-seconds` in any case, so no burner outlives a crashed or
killed measurement.  Each run's output goes to `--log-dir` (one file per run) and, with `--verbose`, to
the terminal.  The table gives per run: exit code, the passed/failed/skipped/error counts of every
pytest summary line in its output (summed: `make test` runs pytest twice), its duration, and the
1-minute load average sampled every 2 s during the run (mean and max).  Exit status 1 if any run
failed (non-zero exit), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]

# A burner: spins until its parent is gone or its time is up.  The clock and the parent are checked only
# every million iterations, so the process is a plain busy loop (about 20-50 ms between checks).
BURNER_CODE = """
import os, sys, time
parent, end = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while True:
    for _ in range(1_000_000):
        pass
    if os.getppid() != parent or time.monotonic() > end:
        break
"""

# pytest's summary: "3 passed, 1 skipped in 12.34s" (-q) or "==== 3 passed, 1 skipped in 12.34s ====".
SUMMARY_LINE = re.compile(r"^=*\s*((?:\d+ (?:passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)"
                          r"(?:, )?)+) in [\d.]+s")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)")
COUNTED_KINDS = ("passed", "failed", "skipped", "error")


class Burners:
    """`count` busy-looping child processes, stopped by `stop()`, at this process's exit, or by themselves."""

    def __init__(self, count: int, max_seconds: float):
        self.procs: List[subprocess.Popen] = []
        for _ in range(count):
            self.procs.append(subprocess.Popen([sys.executable, "-c", BURNER_CODE, str(os.getpid()),
                                                str(max_seconds)], stdin=subprocess.DEVNULL))
        atexit.register(self.stop)

    def running(self) -> int:
        return sum(p.poll() is None for p in self.procs)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass


class LoadSampler:
    """The 1-minute load average every `period` seconds while running."""

    def __init__(self, period: float = 2.0):
        self.period = period
        self.samples: List[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def _run(self):
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.period)


def pytest_counts(output: str) -> Optional[Dict[str, int]]:
    """The counts of every pytest summary line in `output`, summed; None when there is none."""
    totals: Optional[Dict[str, int]] = None
    for line in output.splitlines():
        m = SUMMARY_LINE.match(line.strip())
        if not m:
            continue
        totals = totals or {k: 0 for k in COUNTED_KINDS}
        for n, kind in COUNT.findall(m.group(1)):
            kind = "error" if kind.startswith("error") else kind
            if kind in totals:
                totals[kind] += int(n)
    return totals


def failed_tests(output: str) -> List[str]:
    """The test ids of pytest's short summary ("FAILED test/x.py::test_y - assert ...")."""
    return [line.split(" - ")[0].split(None, 1)[1] for line in output.splitlines()
            if line.startswith(("FAILED ", "ERROR ")) and len(line.split(None, 1)) > 1]


def stop_group(proc: subprocess.Popen, grace: float = 15.0):
    """SIGINT to the run's process group (pytest then stops its ROS node processes, which live in sessions
    of their own, on its way out), SIGKILL to what is left after `grace` seconds."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_once(command: List[str], log_path: Path, timeout: float, verbose: bool) -> Dict[str, object]:
    """Run `command` from the repository root, output to `log_path` (and the terminal if verbose); on
    timeout its whole process group is killed."""
    t0 = time.monotonic()
    with LoadSampler() as load, open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, text=True, errors="replace")
        timed_out = threading.Event()

        def kill_on_timeout():
            timed_out.set()
            stop_group(proc)
        timer = threading.Timer(timeout, kill_on_timeout)
        timer.start()
        chunks = []
        try:
            for line in proc.stdout:
                chunks.append(line)
                log.write(line)
                if verbose:
                    sys.stdout.write(line)
                    sys.stdout.flush()
            code = proc.wait()
        except BaseException:
            stop_group(proc)
            raise
        finally:
            timer.cancel()
    output = "".join(chunks)
    return dict(code=code, timed_out=timed_out.is_set(), counts=pytest_counts(output), failed=failed_tests(output),
                seconds=time.monotonic() - t0, load_mean=sum(load.samples) / len(load.samples),
                load_max=max(load.samples), log=log_path)


def table_row(i: int, r: Dict[str, object]) -> str:
    c = r["counts"] or {}
    counts = "   ".join(f"{c[k]:>4d}" if k in c else "   -" for k in COUNTED_KINDS)
    code = f"{r['code']}{' (timeout)' if r['timed_out'] else ''}"
    return (f"{i:>3d}  {code:>13}   {counts}   {r['seconds']:>8.1f}   {r['load_mean']:>5.2f}   {r['load_max']:>5.2f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="The command comes after `--`; default: make test.")
    p.add_argument("--burners", type=int, default=2, help="CPU-burning processes beside the runs (default 2)")
    p.add_argument("--repeat", type=int, default=3, help="how many times to run the command (default 3)")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds after which one run is killed and counted as failed (default 3600)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="the burners stop by themselves after this many seconds (default: repeat × timeout)")
    p.add_argument("--stop-on-failure", action="store_true", help="stop after the first failed run")
    p.add_argument("--log-dir", type=Path, default=REPO / "out" / "under_load",
                   help="one log file per run (default out/under_load/)")
    p.add_argument("--verbose", action="store_true", help="also copy each run's output to the terminal")
    p.add_argument("command", nargs="*", help="the command to run (after --); default: make test")
    a = p.parse_args(argv)
    if a.burners < 0:
        p.error(f"--burners must be 0 or more (got {a.burners})")
    if a.repeat < 1:
        p.error(f"--repeat must be 1 or more (got {a.repeat})")
    if a.timeout <= 0:
        p.error(f"--timeout must be positive (got {a.timeout})")
    command = a.command or ["make", "test"]
    max_seconds = a.max_seconds if a.max_seconds is not None else a.repeat * a.timeout + 60.0
    if max_seconds <= 0:
        p.error(f"--max-seconds must be positive (got {max_seconds})")
    a.log_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")

    # SIGTERM/SIGHUP end this script through the normal exit path, so atexit stops the burners.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))

    print(f"command: {' '.join(command)}")
    print(f"{a.burners} burner(s), {a.repeat} run(s), {os.cpu_count()} CPU(s), load before "
          f"{os.getloadavg()[0]:.2f}; logs in {a.log_dir}/{stamp}-run*.log", flush=True)
    burners = Burners(a.burners, max_seconds)
    results = []
    try:
        header = "run           exit   passed failed skipped error   seconds   load mean/max"
        print(header, flush=True)
        for i in range(1, a.repeat + 1):
            if burners.running() < a.burners:
                print(f"warning: only {burners.running()} of {a.burners} burners still running "
                      f"(--max-seconds {max_seconds:g} reached?)", file=sys.stderr)
            r = run_once(command, a.log_dir / f"{stamp}-run{i:02d}.log", a.timeout, a.verbose)
            results.append(r)
            print(table_row(i, r), flush=True)
            for t in r["failed"]:
                print(f"       {t}", flush=True)
            if r["code"] != 0 and a.stop_on_failure:
                break
    finally:
        burners.stop()
    bad = [i for i, r in enumerate(results, 1) if r["code"] != 0]
    print(f"{len(results) - len(bad)} of {len(results)} runs passed"
          + (f"; failed: runs {', '.join(map(str, bad))} (logs above)" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
