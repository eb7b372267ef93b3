"""The tests test the package that was installed: where an install other than this source tree is on the path
(colcon build's), the tests and the node subprocesses they start import it, not the source tree they run in
(whose `mbfg_ros/` has no compiled kernel in a colcon workspace).  test/conftest.py sets this up."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import mbfg_ros
from conftest import INSTALLED_PACKAGE_FOLDER, SOURCE_ROOT

IMPORTED_FROM = Path(mbfg_ros.__file__).resolve().parent


def test_the_installed_copy_is_imported_where_there_is_one():
    if INSTALLED_PACKAGE_FOLDER is None:
        assert IMPORTED_FROM == SOURCE_ROOT / "mbfg_ros"
    else:
        assert IMPORTED_FROM == (INSTALLED_PACKAGE_FOLDER / "mbfg_ros").resolve()
        assert IMPORTED_FROM.parent != SOURCE_ROOT


@pytest.mark.skipif(INSTALLED_PACKAGE_FOLDER is not None and sys.version_info < (3, 11),
                    reason="Python 3.10 has no PYTHONSAFEPATH: a subprocess started in the source folder imports "
                           "the source tree before the installed copy")
def test_a_module_run_in_the_source_folder_imports_the_package_under_test():
    # as test/ros_helpers.py starts the nodes: the working folder is the source folder, which `python -m` and
    # `python -c` put first on the path unless PYTHONSAFEPATH is set
    code = "import mbfg_ros; print(mbfg_ros.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=SOURCE_ROOT, env=dict(os.environ),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).resolve().parent == IMPORTED_FROM


@pytest.mark.parametrize("required", [False, True])
def test_the_ros_tests_fail_rather_than_skip_where_make_requires_ros(tmp_path, required):
    """`make test` runs the ROS tests with MBFG_REQUIRE_ROS=1 (its venv installs rclpy): where rclpy then does not
    import, the run fails with the reason instead of passing with every ROS test skipped; without it they skip (a
    machine without ROS).  rclpy is hidden here by a package of that name that refuses to import."""
    from conftest import PACKAGE_PATH, REQUIRE_ROS
    hidden = tmp_path / "rclpy"
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('rclpy hidden by the test')\n")
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_ROS}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(PACKAGE_PATH), env.get("PYTHONPATH", "")])
    if required:
        env[REQUIRE_ROS] = "1"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test/test_node.py",
                          "-k", "services"], cwd=SOURCE_ROOT, env=env, capture_output=True, text=True, timeout=300)
    if required:
        assert out.returncode == 1 and f"{REQUIRE_ROS}=1: rclpy and the ROS 2 message packages do not import" in \
            out.stdout + out.stderr, out.stdout + out.stderr
    else:
        assert out.returncode == 0 and "1 skipped" in out.stdout, out.stdout + out.stderr
