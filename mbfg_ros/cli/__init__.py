"""The `mbfg` command (`python -m mbfg_ros.cli`): `commands` and its CSV input/output `csvio`."""
