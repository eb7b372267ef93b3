"""The package's configuration files (config/) wherever the package is: the source tree, a pip install
(`sys.prefix/share/mbfg_ros`), or a colcon install (the ament index); and the environment that gives a
process the package's Fast DDS profile.

Imports neither rclpy nor launch: the launch description, the demo, the benches and the tests use it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, Mapping, Optional

PKG_ROOT = Path(__file__).resolve().parents[2]

# Fast DDS reads its default profile from the file this variable names (when the participant is created);
# other RMWs ignore it.
PROFILE_VARIABLE = "FASTDDS_DEFAULT_PROFILES_FILE"
DISCOVERY_PROFILE = "fastdds_discovery.xml"


def config_file(name: str) -> Path:
    """The file `name` of the package's config/ directory (FileNotFoundError naming where it was looked for)."""
    bases = [PKG_ROOT / "config", Path(sys.prefix) / "share" / "mbfg_ros" / "config"]
    try:
        from ament_index_python.packages import get_package_share_directory
        bases.append(Path(get_package_share_directory("mbfg_ros")) / "config")
    except Exception:   # no ament index, or mbfg_ros not in it: the other places only
        pass
    for base in bases:
        p = base / name
        if p.exists():
            return p
    raise FileNotFoundError(f"config file {name} not found in {', '.join(str(b) for b in bases)}")


def discovery_profile_env(env: Mapping[str, str], profile: Optional[Path] = None) -> Dict[str, str]:
    """What to add to the environment `env` of a node for the package's discovery profile
    (config/fastdds_discovery.xml, or `profile`): {FASTDDS_DEFAULT_PROFILES_FILE: its path}, or nothing
    if `env` already sets the variable (a user's own profile is kept, and this one not loaded at all)."""
    if PROFILE_VARIABLE in env:
        return {}
    return {PROFILE_VARIABLE: str(profile or config_file(DISCOVERY_PROFILE))}
