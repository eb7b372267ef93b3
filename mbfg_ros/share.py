"""Where the package's data folders (`mechanisms/`, `config/`) are: the source tree, a colcon install (the
ament index) or a pip install (`sys.prefix/share/mbfg_ros`).  Imports neither rclpy nor launch."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

PKG_ROOT = Path(__file__).resolve().parents[1]


def share_folders(name: str) -> List[Path]:
    """The places the package's folder `name` may be, in the order they are searched (existing or not)."""
    folders = [PKG_ROOT / name]
    try:  # installed by colcon / pip data_files
        from ament_index_python.packages import get_package_share_directory
        folders.append(Path(get_package_share_directory("mbfg_ros")) / name)
    except Exception:   # no ament index, or mbfg_ros not in it: the other places only
        pass
    folders.append(Path(sys.prefix) / "share" / "mbfg_ros" / name)
    return folders
