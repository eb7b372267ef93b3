"""The package's Fast DDS profile (config/fastdds_discovery.xml): what it sets, that the demo/bench/test
environment and the launch description name it unless the user names another, and over real DDS that
the RMW reads the file the variable names (a broken copy is reported) and that an estimator started with
the profile beside the running simulated plant estimates from the plant's inputs.

No timing is asserted (start-up times are measured by bench/node_startup.py); waits poll generously.
"""

from __future__ import annotations

import os
import py_compile
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from unittest import mock

import pytest

from ros_helpers import CONFIG, REPO, Probe, RosProcess, estimator_process, fresh_domain_id, rclpy_available, wait_until
from mbfg_ros.ros.demo import ros_env
from mbfg_ros.ros import package_files
from mbfg_ros.ros.package_files import (DISCOVERY_PROFILE, PROFILE_VARIABLES, config_file, discovery_profile_env,
                                        fast_dds_major, profile_variables)

PROFILE = REPO / "config" / DISCOVERY_PROFILE
NS = {"dds": "http://www.eprosima.com"}
FAST_DDS_DEFAULT_ANNOUNCEMENT_S = 3.0
FAST_DDS_DEFAULT_LEASE_S = 20.0
DT = 0.004          # a slower step than the config's 1 ms: the machine may be busy; the plant steps alike

needs_ros = pytest.mark.skipif(not rclpy_available(), reason="rclpy and the ROS 2 message packages are not "
                                                             "installed (pip wheels or a sourced ROS 2)")


def _duration_s(element) -> float:
    sec = element.find("dds:sec", NS)
    nanosec = element.find("dds:nanosec", NS)
    return (float(sec.text) if sec is not None else 0.0) + (float(nanosec.text) * 1e-9 if nanosec is not None else 0.0)


def test_the_profile_is_the_default_participant_profile_with_a_quicker_announcement():
    root = ET.parse(PROFILE).getroot()
    assert root.tag == "{http://www.eprosima.com}dds"
    participants = root.findall("dds:profiles/dds:participant", NS)
    assert len(participants) == 1 and participants[0].get("is_default_profile") == "true"
    discovery = participants[0].find("dds:rtps/dds:builtin/dds:discovery_config", NS)
    announcement = _duration_s(discovery.find("dds:leaseAnnouncement", NS))
    lease = discovery.find("dds:leaseDuration", NS)
    lease_s = _duration_s(lease) if lease is not None else FAST_DDS_DEFAULT_LEASE_S
    assert 0 < announcement < FAST_DDS_DEFAULT_ANNOUNCEMENT_S
    assert lease_s >= 10 * announcement       # a participant is not dropped for a few late announcements


def test_the_environment_names_the_profile_unless_the_user_names_one(monkeypatch):
    for name in PROFILE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    # the package's file: the source's, or its copy where the package under test is installed (colcon, pip)
    package_profile = config_file(DISCOVERY_PROFILE)
    assert package_profile.read_bytes() == PROFILE.read_bytes()
    # the name this Fast DDS reads: 3 (Kilted) the first (the second with a warning), 2 (Humble, Jazzy) the second
    assert PROFILE_VARIABLES == ("FASTDDS_DEFAULT_PROFILES_FILE", "FASTRTPS_DEFAULT_PROFILES_FILE")
    ours = profile_variables(os.environ)
    assert len(ours) == 1 or fast_dds_major(os.environ) is None, ours
    assert discovery_profile_env({}) == {name: str(package_profile) for name in profile_variables({})}
    assert all(ros_env(7)[name] == str(package_profile) for name in ours)
    assert all(name in ours or name not in ros_env(7) for name in PROFILE_VARIABLES)
    for name in PROFILE_VARIABLES:
        assert discovery_profile_env({name: "/my/profile.xml"}) == {}
        monkeypatch.setenv(name, "/my/profile.xml")
        assert ros_env(7)[name] == "/my/profile.xml"
        assert all(name == other or other not in ros_env(7) for other in PROFILE_VARIABLES)
        monkeypatch.delenv(name)
    with pytest.raises(FileNotFoundError, match="no_such_file.xml"):
        config_file("no_such_file.xml")


def test_the_profile_is_named_by_the_variable_the_distributions_fast_dds_reads():
    """A sourced ROS installation says its distribution: Humble and Jazzy (Fast DDS 2) read only the old name;
    Kilted's Fast DDS 3 reads the new one and warns about the old one at every start.  Unknown: both."""
    profile = Path("/p.xml")
    for distro in ("humble", "jazzy", "Jazzy "):
        assert discovery_profile_env({"ROS_DISTRO": distro}, profile) == {"FASTRTPS_DEFAULT_PROFILES_FILE": "/p.xml"}
    for distro in ("kilted", "rolling", "lyrical"):
        assert discovery_profile_env({"ROS_DISTRO": distro}, profile) == {"FASTDDS_DEFAULT_PROFILES_FILE": "/p.xml"}
    assert fast_dds_major({"ROS_DISTRO": "jazzy"}) == 2 and fast_dds_major({"ROS_DISTRO": "kilted"}) == 3
    # without ROS_DISTRO (the PyPI wheels): the installed Fast DDS's version, both names when there is none
    package_files._installed_fast_dds_major.cache_clear()
    try:
        with mock.patch.object(package_files.importlib.metadata, "distributions", return_value=[]):
            assert profile_variables({}) == PROFILE_VARIABLES
            assert set(discovery_profile_env({}, profile)) == set(PROFILE_VARIABLES)
    finally:
        package_files._installed_fast_dds_major.cache_clear()
    assert discovery_profile_env({"ROS_DISTRO": "humble", "FASTDDS_DEFAULT_PROFILES_FILE": "/mine.xml"}) == {}


def test_the_launch_files_compile():
    # `launch` is not installed here (test_four_bar_launch.py skips): at least they must be valid Python
    for path in [*sorted((REPO / "launch").glob("*.launch.py")), REPO / "mbfg_ros" / "ros" / "launch_description.py"]:
        py_compile.compile(str(path), doraise=True, cfile=None, dfile=str(path))


@needs_ros
def test_the_rmw_reads_the_file_the_variable_names(tmp_path):
    """A broken copy of the profile is reported by Fast DDS: the environment the package sets reaches the RMW
    of this ROS distribution (Fast DDS 2 or 3), so the package's own file (next test) is parsed and loaded when
    no error is printed."""
    broken = tmp_path / "broken.xml"
    broken.write_text(PROFILE.read_text().replace("</rtps>", ""))
    env = {name: value for name, value in ros_env(fresh_domain_id()).items() if name not in PROFILE_VARIABLES}
    env.update(discovery_profile_env(env, broken))
    code = ("import rclpy; rclpy.init(); node = rclpy.create_node('mbfg_profile_check'); "
            "node.destroy_node(); rclpy.shutdown(); print('participant created')")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "participant created" in out.stdout, out.stdout + out.stderr
    assert "XMLPARSER" in out.stdout + out.stderr and str(broken) in out.stdout + out.stderr
    # named by the variable this Fast DDS reads without a word (Kilted's warns about the old one)
    assert not re.search(r"PROFILES_FILE.*deprecated", out.stdout + out.stderr), out.stdout + out.stderr


@needs_ros
def test_an_estimator_started_with_the_profile_beside_the_running_plant_estimates(tmp_path):
    dom = fresh_domain_id()
    with_profile = discovery_profile_env({}, PROFILE)
    plant = RosProcess("mbfg_ros.ros.sim_node", ["--params-file", str(CONFIG), "-p", f"dt:={DT}",
                                                 "-p", "duration:=0.0"], dom, tmp_path / "plant.log", with_profile)
    probe = est = None
    try:
        probe = Probe(dom)           # this process's participant: the profile too (ros_env), unless the user set one
        # the plant is up and publishing before the estimator starts (a node restarted on a running robot)
        plant_up = wait_until(lambda: probe.node.count_publishers("/joint_observations") > 0, 60, 0.05)
        assert plant_up, plant.output()
        time.sleep(0.5)
        # max_input_age 60 s: a busy machine can hold the Python plant seconds behind the wall clock, and the
        # estimator would reject all its readings as stale (this test is about discovery, not the plant's pace)
        est = estimator_process(dom, tmp_path / "estimator.log", params={"dt": DT, "max_input_age": 60.0},
                                extra_env=with_profile)
        assert wait_until(lambda: len(probe.snapshot("js")) > 0, 90, 0.05), est.output()
        assert est.alive() and plant.alive()
        out = est.output()
        assert "start-up, s after the process started:" in out and "first input" in out, out
        assert "XMLPARSER" not in out + plant.output()
    finally:
        if probe is not None:
            probe.close()
        if est is not None:
            assert est.stop() == 0
        plant.stop()
