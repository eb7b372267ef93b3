"""Four-bar crank: the mbfg_ros estimator (+ the simulated plant by default).

    ros2 launch mbfg_ros four_bar.launch.py                       # estimator + four_bar_sim, wall clock
    ros2 launch mbfg_ros four_bar.launch.py sim:=false            # estimator only (real robot / other source)
    ros2 launch mbfg_ros four_bar.launch.py use_sim_time:=true    # four_bar_sim publishes /clock
    ros2 launch mbfg_ros four_bar.launch.py sim:=false use_sim_time:=true   # with `ros2 bag play --clock`
    ros2 launch mbfg_ros four_bar.launch.py mode:=estimation config:=/path/to/my.yaml mechanism:=/path/to/m.yaml

Arguments: use_sim_time (false), config (share/mbfg_ros/config/four_bar.yaml), mechanism
(share/mbfg_ros/mechanisms/four_bar_crank.yaml), mode ('' = as in the config file:
forward_dynamics | estimation | fused), sim (true: also start four_bar_sim).
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

CONFIG_FILE = "four_bar.yaml"
MECHANISM_FILE = "four_bar_crank.yaml"


def _truthy(text):
    return str(text).strip().lower() in ("1", "true", "yes", "on")


def _nodes(context, *args, **kwargs):
    cfg = LaunchConfiguration("config").perform(context)
    mech = LaunchConfiguration("mechanism").perform(context)
    mode = LaunchConfiguration("mode").perform(context).strip()
    sim_time = _truthy(LaunchConfiguration("use_sim_time").perform(context))
    overrides = {"mechanism": mech, "use_sim_time": sim_time}
    if mode:
        overrides["mode"] = mode
    nodes = [Node(package="mbfg_ros", executable="estimator", name="mbfg_estimator", output="screen",
                  emulate_tty=True, parameters=[cfg, overrides])]
    if _truthy(LaunchConfiguration("sim").perform(context)):
        # The plant is the clock source when use_sim_time is set; it never runs on sim time itself.
        nodes.append(Node(package="mbfg_ros", executable="four_bar_sim", name="four_bar_sim", output="screen",
                          emulate_tty=True,
                          parameters=[cfg, {"mechanism": mech, "publish_clock": sim_time, "use_sim_time": False}]))
    return nodes


def generate_launch_description():
    share = get_package_share_directory("mbfg_ros")
    return LaunchDescription([
        DeclareLaunchArgument("use_sim_time", default_value="false",
                              description="Use /clock (from four_bar_sim, or `ros2 bag play --clock`)"),
        DeclareLaunchArgument("config", default_value=os.path.join(share, "config", CONFIG_FILE),
                              description="Parameter file of the estimator (and of four_bar_sim)"),
        DeclareLaunchArgument("mechanism", default_value=os.path.join(share, "mechanisms", MECHANISM_FILE),
                              description="Mechanism YAML (a path, or a name in share/mbfg_ros/mechanisms)"),
        DeclareLaunchArgument("mode", default_value="",
                              description="forward_dynamics | estimation | fused ('' = as in the config)"),
        DeclareLaunchArgument("sim", default_value="true",
                              description="Also start the simulated plant four_bar_sim"),
        OpaqueFunction(function=_nodes),
    ])
