"""Four-bar crank: the mbfg_ros estimator (+ the simulated plant by default).

    ros2 launch mbfg_ros four_bar.launch.py                       # estimator + four_bar_sim, wall clock
    ros2 launch mbfg_ros four_bar.launch.py sim:=false            # estimator only (real robot / other source)
    ros2 launch mbfg_ros four_bar.launch.py use_sim_time:=true    # four_bar_sim publishes /clock
    ros2 launch mbfg_ros four_bar.launch.py sim:=false use_sim_time:=true   # with `ros2 bag play --clock`
    ros2 launch mbfg_ros four_bar.launch.py mode:=estimation config:=/path/to/my.yaml mechanism:=/path/to/m.yaml

Arguments (see mbfg_ros/ros/launch_description.py): use_sim_time (false), config
(share/mbfg_ros/config/four_bar.yaml), mechanism (share/mbfg_ros/mechanisms/four_bar_crank.yaml),
mode ('' = as in the config file), sim (true: also start four_bar_sim).
Both processes get the Fast DDS profile share/mbfg_ros/config/fastdds_discovery.xml (quicker
discovery) unless the user names one; see docs/ros2_interfaces.md, "DDS discovery profile".
"""

from mbfg_ros.ros.launch_description import estimator_launch_description


def generate_launch_description():
    return estimator_launch_description("four_bar.yaml", "four_bar_crank.yaml")
