"""The ROS-free simulated plant (`plant`)."""
