"""Which mbfg_ros the tests import, and fixtures shared by the test files: the shipped mechanisms most tests run
on (loaded once per session; a Mechanism is immutable).

The package under test is the installed one where an install other than this source tree is on the path (a colcon
workspace: `colcon test` runs pytest in the source folder, whose `mbfg_ros/` has no compiled kernel and would
shadow the installed package, kernel included); else the source tree (an editable install, `make test`).  Node
subprocesses started in the source folder (`python -m mbfg_ros...`, cwd the source tree) import the same package:
PYTHONSAFEPATH keeps the working folder off their path (Python 3.11+).
"""

import os
import sys
from pathlib import Path
from typing import Optional

import pytest

SOURCE_ROOT = Path(__file__).resolve().parents[1]


def _path_entry(entry: str) -> Path:
    return Path(entry or os.getcwd()).resolve()   # '' on sys.path is the working folder


def installed_elsewhere() -> Optional[Path]:
    """The sys.path folder of an mbfg_ros that is not this source tree's (a colcon or pip install), or None."""
    for entry in sys.path:
        folder = _path_entry(entry)
        init = folder / "mbfg_ros" / "__init__.py"
        # resolve(): a symlinked install (colcon --symlink-install) whose files are this source tree is the source
        if folder != SOURCE_ROOT and init.is_file() and init.resolve().parents[1] != SOURCE_ROOT:
            return folder
    return None


INSTALLED_PACKAGE_FOLDER = installed_elsewhere()
if INSTALLED_PACKAGE_FOLDER is not None:
    if "mbfg_ros" in sys.modules and Path(sys.modules["mbfg_ros"].__file__).resolve().parents[1] == SOURCE_ROOT:
        raise RuntimeError(f"mbfg_ros was imported from the source tree {SOURCE_ROOT} before test/conftest.py "
                           f"could put the installed copy in {INSTALLED_PACKAGE_FOLDER} first")
    sys.path[:] = [entry for entry in sys.path if _path_entry(entry) != SOURCE_ROOT]
    os.environ["PYTHONSAFEPATH"] = "1"

#: the folder a subprocess's PYTHONPATH needs for the package under test (the installed copy, whose kernel is
#: built for its interpreter, else the source tree)
PACKAGE_PATH = INSTALLED_PACKAGE_FOLDER if INSTALLED_PACKAGE_FOLDER is not None else SOURCE_ROOT

from mbfg_ros.model.mechanism import load_mechanism  # noqa: E402  (after the path is set)


#: the DFKI double pendulum excerpt shipped for the tests and benches (bench/data/dfki_double_pendulum, BSD-3-Clause)
DFKI_DATA = SOURCE_ROOT / "bench" / "data" / "dfki_double_pendulum"
DFKI_COLUMNS = ["t", "pos_meas1", "pos_meas2", "tau_con1", "tau_con2", "tau_meas1", "tau_meas2"]


def dfki_rows(run: str, seconds: float = float("inf")):
    """The rows of a DFKI run (`DFKI_DATA / RUN.csv.gz`, its columns `DFKI_COLUMNS`: the logger's time, positions,
    commanded and measured torques) up to `seconds`."""
    import gzip
    import numpy as np
    with gzip.open(DFKI_DATA / f"{run}.csv.gz", "rt") as f:
        rows = np.loadtxt(f, delimiter=",", skiprows=1)
    return rows[rows[:, 0] <= seconds]


def write_dfki_csvs(folder: Path, rows) -> tuple:
    """(observations, torques): `dfki_rows` as `mbfg` CSVs named by the double pendulum files' encoders and
    actuators (t, q1, q2: the positions; the commanded torques)."""
    import numpy as np
    obs, cmd = folder / "obs.csv", folder / "cmd.csv"
    for path, cols in ((obs, [0, 1, 2]), (cmd, [0, 3, 4])):
        np.savetxt(path, rows[:, cols], delimiter=",", header="t,q1,q2", comments="", fmt="%.17g")
    return obs, cmd


#: set by `make test` and `make test-jazzy` for the ROS tests, whose venv installs rclpy and the message packages:
#: there a ROS test that skips because they do not import would pass a broken install without running
REQUIRE_ROS = "MBFG_REQUIRE_ROS"


def pytest_sessionstart(session):
    if os.environ.get(REQUIRE_ROS) == "1":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from ros_helpers import rclpy_available
        if not rclpy_available():
            pytest.exit(f"{REQUIRE_ROS}=1: rclpy and the ROS 2 message packages do not import in this environment "
                        f"(the ROS tests would all skip): install them (requirements.txt) or unset {REQUIRE_ROS}",
                        returncode=1)


def pytest_report_header(config):
    import mbfg_ros
    from mbfg_ros import native
    where = "installed copy" if INSTALLED_PACKAGE_FOLDER is not None else "source tree"
    kernel = f"compiled from _kernel.c {native.SOURCE_SHA256}"
    return [f"mbfg_ros under test: {Path(mbfg_ros.__file__).parent} ({where}); kernel: {kernel}"]


@pytest.fixture(scope="session")
def crank():
    """The crank four-bar (mechanisms/four_bar_crank.yaml)."""
    return load_mechanism("four_bar_crank")


@pytest.fixture(scope="session")
def robot():
    """The two-motor pick-and-place parallel robot (mechanisms/pick_and_place_robot.yaml)."""
    return load_mechanism("pick_and_place_robot")


def crank_torque(t):
    """The known crank torque of the `driven` motion [N·m]."""
    import numpy as np
    return 20.0 * np.sin(3 * t) + 5.0 * np.cos(7 * t) - 5.0


@pytest.fixture(scope="session")
def driven():
    """The crank four-bar driven by `crank_torque`, 2 s at 1 kHz (reference_four_bar)."""
    import reference_four_bar as R
    return R.simulate(2.0, 1e-3, 9.81, crank_torque)
