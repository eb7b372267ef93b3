"""Tuning the estimator's stochastic model from one recording of the real system (`mbfg tune`).

`likelihood`: the fit (maximum innovation likelihood of `estimation.reduced_ekf.ReducedEKF`, which carries the
estimator's stochastic model); `params_file`: the node's parameter-file format it writes and `mbfg estimate
--params` reads; `bag`: recordings from a rosbag2 bag (sensor_msgs/JointState, via `rosbags`).
"""
