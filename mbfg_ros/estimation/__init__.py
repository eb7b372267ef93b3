"""The real-time fixed-lag estimator: `config` (`EstimatorConfig`, `Estimate`) and `estimator`
(`FixedLagEstimator`, a facade over `efforts`, `step_factors`, `sensors`, `stepping`, `seeding` and
`estimates`, chosen once at construction)."""
