"""The ROS 2 side (the only part that imports rclpy, except the rclpy-free `scheduler`): the estimator
node and its parameters, scheduler, outputs, diagnostics, conversions and fast loop; the simulated-plant
node, the demo and the shared launch description."""
