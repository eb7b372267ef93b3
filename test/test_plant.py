"""The simulated plant's actuator model (`mbfg_ros.sim.plant.Actuator`) and the commanded / applied efforts
the plant reports."""

from __future__ import annotations

import numpy as np
import pytest

from mbfg_ros.dynamics import constrained as dynamics
from mbfg_ros.sim.plant import Actuator, SimulatedPlant


def test_actuator_law(robot):
    act = Actuator.from_values(robot, {"gain": [0.9, 1.1], "coulomb": 2.0, "coulomb_rate_scale": 0.1,
                                       "viscous": [0.3, 0.0], "bias": [0.5, -1.0]})
    cmd, rate = np.array([10.0, -4.0]), np.array([0.2, -3.0])
    expected = np.array([0.9 * 10 - 2 * np.tanh(2.0) - 0.3 * 0.2 + 0.5,
                         1.1 * -4 - 2 * np.tanh(-30.0) - 0.0 + -1.0])
    assert np.allclose(act.applied(cmd, rate), expected, rtol=0, atol=1e-12)
    assert not act.is_ideal
    ideal = Actuator.ideal(robot)
    assert ideal.is_ideal and np.array_equal(ideal.applied(cmd, rate), cmd)
    d = Actuator.default_mismatch(robot)
    assert np.allclose(d.gain, 0.9) and np.allclose(d.coulomb, 1.5) and np.allclose(d.viscous, 0.3)
    # at rest the smooth Coulomb term vanishes; far above its rate scale it is the full 1.5
    assert np.allclose(d.applied(cmd, np.zeros(2)), 0.9 * cmd)
    assert np.allclose(d.applied(np.zeros(2), np.array([1.0, -1.0])), [-1.5 - 0.3, 1.5 + 0.3], atol=1e-6)


@pytest.mark.parametrize("values, message", [
    ({"gain": [1.0, 2.0, 3.0]}, "gain must be one number or 2"),
    ({"gain": 0.0}, "gain of 'motor1' must be > 0"),
    ({"coulomb": [0.0, -1.0]}, "coulomb of 'motor2' must be >= 0"),
    ({"viscous": float("nan")}, "viscous of 'motor1' must be finite"),
    ({"coulomb_rate_scale": 0.0}, "coulomb_rate_scale of 'motor1' must be > 0"),
    ({"bias": "x"}, "bias must be a number"),
    ({"friction": 1.0}, "unknown actuator fields ['friction']"),
])
def test_actuator_errors_name_the_field_and_actuator(robot, values, message):
    with pytest.raises(ValueError) as exc:
        Actuator.from_values(robot, values)
    assert message in str(exc.value)


def test_plant_applies_the_command_through_the_actuator(crank):
    """Default plant: the applied effort differs from the command by the actuator law at the sampled rate,
    and the generalized forces and accelerations are those of the applied effort."""
    traj = SimulatedPlant(crank, dt=1e-3, seed=0).simulate(0.5)
    act = Actuator.default_mismatch(crank)
    c = crank.actuated
    assert np.allclose(traj.applied, [act.applied(traj.efforts[k], traj.v[k, c]) for k in range(len(traj))])
    assert np.abs(traj.applied - traj.efforts).max() > 1.0          # a real mismatch
    for k in (0, 100, 400):
        assert np.allclose(traj.Q[k], crank.generalized_forces(traj.applied[k]))
        assert np.allclose(traj.a[k], dynamics.forward_dynamics(crank, traj.q[k], traj.v[k], traj.Q[k]))
    head = traj.head(10)
    assert np.array_equal(head.applied, traj.applied[:10]) and np.array_equal(head.efforts, traj.efforts[:10])


def test_the_plant_integrates_the_kernels_accelerations_and_numpys_where_the_kernel_fails(robot):
    """The plant's q̈ comes from the compiled kernel (one LU solve; numpy's forward dynamics cost 45 % of a 1-kHz
    plant's CPU, which two cores shared with the estimator could not spare: the 40-s demo lost 13–19 % of its
    estimates, 1 % with the kernel): numpy's to 1e-12 along the robot's motion, and numpy's where the kernel's
    augmented system is singular."""
    plant = SimulatedPlant(robot, dt=5e-3, seed=0)
    assert plant._kernel is not None
    traj = plant.simulate(1.0)
    for k in range(0, len(traj), 20):
        numpy_a = dynamics.forward_dynamics(robot, traj.q[k], traj.v[k], traj.Q[k])
        assert np.abs(traj.a[k] - numpy_a).max() <= 1e-12 * (1.0 + np.abs(numpy_a).max())

    class Singular:
        def acceleration(self, q, v, Q, a):
            return False
    plant._kernel = Singular()
    k = 60
    assert np.array_equal(plant._accel(traj.q[k], traj.v[k], traj.Q[k]),
                          dynamics.forward_dynamics(robot, traj.q[k], traj.v[k], traj.Q[k]))


def test_ideal_plant_applies_the_command(crank):
    traj = SimulatedPlant(crank, dt=1e-3, seed=0, actuator=Actuator.ideal(crank)).simulate(0.2)
    assert np.array_equal(traj.applied, traj.efforts)


def test_plant_refuses_an_actuator_of_another_mechanism(crank, robot):
    with pytest.raises(ValueError, match="actuator model has 2 actuators"):
        SimulatedPlant(crank, actuator=Actuator.ideal(robot))


@pytest.mark.parametrize("args, message", [
    (["-p", "actuator.gain:=0.0"], "parameter 'actuator.gain' of 'crank' must be > 0"),
    (["-p", "actuator.viscous:=[0.1, 0.2]"], "parameter 'actuator.viscous' must be one number or 1"),
    (["-p", "actuator.bias:=oops"], "parameter 'actuator.bias' must be a number or a list of numbers"),
])
def test_sim_node_refuses_bad_actuator_parameters(args, message):
    """`four_bar_sim` with a bad actuator parameter stops at start-up: exit code 2, one line naming it."""
    import os
    import subprocess
    import sys
    pytest.importorskip("rclpy", reason="the plant node needs rclpy")
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    from conftest import PACKAGE_PATH
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_PATH) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", ROS_LOCALHOST_ONLY="1", ROS_DOMAIN_ID="97")
    p = subprocess.run([sys.executable, "-m", "mbfg_ros.ros.sim_node", "--ros-args", *args], env=env,
                       capture_output=True, text=True, timeout=60, cwd=str(repo))
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert message in p.stderr and own_lines(p.stderr).startswith("[four_bar_sim] error:"), p.stderr


def own_lines(stderr: str) -> str:
    """stderr without rcl's and the RMW's own warnings (Jazzy warns that ROS_LOCALHOST_ONLY, which the tests set
    beside ROS_AUTOMATIC_DISCOVERY_RANGE for Humble, is deprecated; Kilted's Fast DDS that
    FASTRTPS_DEFAULT_PROFILES_FILE is, where the version of Fast DDS is not known and both are set)."""
    return "\n".join(line for line in stderr.strip().splitlines()
                     if "] [rcl]: " not in line and "] [rmw_fastrtps_shared_cpp]: " not in line)


SECRET_LINES = [f"user{i}:x:{1000 + i}:{1000 + i}:{'k3y' * 12}{i}:/home/user{i}:/bin/bash" for i in range(5)]


def _shows_secret(text: str, width: int = 25) -> bool:
    """Whether `text` quotes `width` or more consecutive characters of any SECRET_LINES line."""
    return any(line[j:j + width] in text for line in SECRET_LINES for j in range(len(line) - width + 1))


@pytest.mark.parametrize("module,name", [("mbfg_ros.ros.sim_node", "four_bar_sim"),
                                         ("mbfg_ros.ros.node", "mbfg_estimator")])
@pytest.mark.parametrize("content,message", [
    ("\n".join(SECRET_LINES) + "\n", "is this a mechanism file?"),    # the wrong file: never quoted
    ("name: [broken\n", "YAML syntax error"),
    (None, "mechanism file not found"),
], ids=["not-a-mechanism", "yaml-syntax", "missing"])
def test_both_nodes_report_a_bad_mechanism_file_in_one_line(tmp_path, module, name, content, message):
    """Both executables stop at start-up on a bad mechanism file with exit code 2 and one line that names
    the parameter and the problem (no traceback), quoting none of the file's lines."""
    import os
    import subprocess
    import sys
    pytest.importorskip("rclpy", reason="the nodes need rclpy")
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    path = tmp_path / "mechanism.yaml"
    if content is not None:
        path.write_text(content)
    from conftest import PACKAGE_PATH
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_PATH) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", ROS_LOCALHOST_ONLY="1", ROS_DOMAIN_ID="97")
    p = subprocess.run([sys.executable, "-m", module, "--ros-args", "-p", f"mechanism:={path}"], env=env,
                       capture_output=True, text=True, timeout=120, cwd=str(repo))
    err = own_lines(p.stderr)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert len(err.splitlines()) == 1 and err.startswith(f"[{name}] error: parameter 'mechanism'"), err
    assert message in err and "Traceback" not in p.stdout + p.stderr, err
    assert not _shows_secret(p.stdout + p.stderr), err
