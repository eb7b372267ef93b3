"""Pick-and-place parallel robot (2 motors): the mbfg_ros estimator (+ the simulated plant by default).

    ros2 launch mbfg_ros pick_and_place.launch.py                 # estimator + simulated robot, wall clock
    ros2 launch mbfg_ros pick_and_place.launch.py sim:=false      # estimator only (real robot / other source)
    ros2 launch mbfg_ros pick_and_place.launch.py use_sim_time:=true   # the simulated robot publishes /clock
    ros2 launch mbfg_ros pick_and_place.launch.py sim:=false use_sim_time:=true   # with `ros2 bag play --clock`

Arguments (see mbfg_ros/ros/launch_description.py): use_sim_time (false), config
(share/mbfg_ros/config/pick_and_place.yaml), mechanism (share/mbfg_ros/mechanisms/pick_and_place_robot.yaml),
mode ('' = as in the config file), sim (true: also start the simulated plant: executable four_bar_sim,
node pick_and_place_sim).
Both processes get the Fast DDS profile share/mbfg_ros/config/fastdds_discovery.xml (quicker
discovery) unless the user names one; see docs/ros2_interfaces.md, "DDS discovery profile".
"""

from mbfg_ros.ros.launch_description import estimator_launch_description


def generate_launch_description():
    return estimator_launch_description("pick_and_place.yaml", "pick_and_place_robot.yaml")
