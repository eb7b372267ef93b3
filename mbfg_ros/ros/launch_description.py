"""The launch description shared by launch/four_bar.launch.py and launch/pick_and_place.launch.py.

Arguments: use_sim_time (false), config (a parameter file; default share/mbfg_ros/config/<config_file>),
mechanism (a path, or a name in share/mbfg_ros/mechanisms; default <mechanism_file>), mode ('' = as in
the config file: forward_dynamics | estimation | fused), sim (true: also start the simulated plant,
executable four_bar_sim, which owns /clock when use_sim_time is set; its node is named for the mechanism
as the parameter file's section for it: `four_bar_sim`, `pick_and_place_sim`).

Both processes get the package's Fast DDS profile (share/mbfg_ros/config/fastdds_discovery.xml: quicker
discovery of a node started beside running ones) through FASTDDS_DEFAULT_PROFILES_FILE (Fast DDS 3: Kilted) or
FASTRTPS_DEFAULT_PROFILES_FILE (Fast DDS 2: Humble, Jazzy), by ROS_DISTRO (`package_files.profile_variables`),
unless one is already set; other RMWs ignore them.

Imports `launch` and `launch_ros` (a ROS 2 installation), so only launch files import this module.
"""

import os
from pathlib import Path

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from mbfg_ros.ros.package_files import DISCOVERY_PROFILE, discovery_profile_env, plant_node_name


def _truthy(text) -> bool:
    return str(text).strip().lower() in ("1", "true", "yes", "on")


def _nodes(context, *args, **kwargs):
    cfg = LaunchConfiguration("config").perform(context)
    mech = LaunchConfiguration("mechanism").perform(context)
    mode = LaunchConfiguration("mode").perform(context).strip()
    sim_time = _truthy(LaunchConfiguration("use_sim_time").perform(context))
    overrides = {"mechanism": mech, "use_sim_time": sim_time}
    # the profile, unless the environment that launch gives the nodes names one already
    dds_env = discovery_profile_env(getattr(context, "environment", os.environ),
                                    Path(get_package_share_directory("mbfg_ros")) / "config" / DISCOVERY_PROFILE)
    if mode:
        overrides["mode"] = mode
    nodes = [Node(package="mbfg_ros", executable="estimator", name="mbfg_estimator", output="screen",
                  emulate_tty=True, parameters=[cfg, overrides], additional_env=dds_env)]
    if _truthy(LaunchConfiguration("sim").perform(context)):
        # The plant is the clock source when use_sim_time is set; it never runs on sim time itself.  Its node is
        # named for the mechanism, as the parameter file's section for it (four_bar_sim, pick_and_place_sim)
        nodes.append(Node(package="mbfg_ros", executable="four_bar_sim", name=plant_node_name(Path(cfg)),
                          output="screen",
                          emulate_tty=True, additional_env=dds_env,
                          parameters=[cfg, {"mechanism": mech, "publish_clock": sim_time, "use_sim_time": False}]))
    return nodes


def estimator_launch_description(config_file: str, mechanism_file: str) -> LaunchDescription:
    """Estimator (+ simulated plant unless sim:=false) with the package's `config_file` and `mechanism_file`
    as defaults of the `config` and `mechanism` arguments."""
    share = get_package_share_directory("mbfg_ros")
    return LaunchDescription([
        DeclareLaunchArgument("use_sim_time", default_value="false",
                              description="Use /clock (from four_bar_sim, or `ros2 bag play --clock`)"),
        DeclareLaunchArgument("config", default_value=os.path.join(share, "config", config_file),
                              description="Parameter file of the estimator (and of four_bar_sim)"),
        DeclareLaunchArgument("mechanism", default_value=os.path.join(share, "mechanisms", mechanism_file),
                              description="Mechanism YAML (a path, or a name in share/mbfg_ros/mechanisms)"),
        DeclareLaunchArgument("mode", default_value="",
                              description="forward_dynamics | estimation | fused ('' = as in the config)"),
        DeclareLaunchArgument("sim", default_value="true",
                              description="Also start the simulated plant four_bar_sim"),
        OpaqueFunction(function=_nodes),
    ])
