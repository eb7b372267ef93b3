"""The fast path's factor graph: `layout` (the stacked per-step state), `step_model` (one step's units
linearized in Python into one whitened linear factor), `window` (the iSAM2 fixed-lag window with the
relinearization safeguard), `gtsam_adapters` (state keys, units as `gtsam.CustomFactor`, noise)."""
