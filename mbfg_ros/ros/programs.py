"""The installed node executables (`estimator`, `four_bar_sim`): the stop signals are taken over first,
then the node's module (rclpy, numpy, GTSAM: most of the start-up) is imported and run, so that a signal
at any stage of the start-up is an orderly stop with exit code 0 (see `stop_signals`)."""

from mbfg_ros.ros import stop_signals


def estimator() -> int:
    stop_signals.install()
    from mbfg_ros.ros import node
    return node.main()


def four_bar_sim() -> int:
    stop_signals.install()
    from mbfg_ros.ros import sim_node
    return sim_node.main()
