#!/usr/bin/env bash
# A real colcon workspace, outside the repository, that builds and tests this checkout as a ROS user would:
#   bench/colcon_workspace.sh DIR [colcon test arguments...]
# DIR gets a venv (the Jazzy set of requirements-jazzy.txt, GTSAM --no-deps as the README tells, and
# colcon-common-extensions from PyPI; PYTEST_VERSION=7.4.4 for Ubuntu 24.04's pytest instead of the file's) and
# a workspace ws/ whose src/mbfg_ros is a copy of the tracked files of this checkout (a fresh clone: no compiled
# kernel in the source).  Then: colcon build, colcon test, colcon test-result --verbose.  Exits non-zero when a
# step or a test fails; a second run reuses the venv.  Python: JAZZY_PYTHON, else python3.12, else python3.
# launch_testing is not on PyPI: without it the launch test skips (README, "Install in a ROS 2 workspace").
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DIR [colcon test arguments...]" >&2; exit 2; }
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$(mkdir -p "$1" && cd "$1" && pwd)"
shift
case "$dir/" in "$repo"/*) echo "error: $dir is inside the repository; colcon would find the package twice" >&2; exit 2;; esac

python="${JAZZY_PYTHON:-}"
if [ -z "$python" ]; then   # as the Makefile's test-jazzy: a working python3.12 (also a pyenv one), else python3
  for candidate in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 python3; do
    if "$candidate" -c '' >/dev/null 2>&1; then python="$candidate"; break; fi
  done
fi
if [ ! -x "$dir/venv/bin/python" ]; then
  echo "creating $dir/venv with $("$python" --version 2>&1)"
  "$python" -m venv "$dir/venv"
  "$dir/venv/bin/python" -m pip install --quiet --upgrade pip || true
  if [ -n "${PYTEST_VERSION:-}" ]; then
    grep -v '^pytest==' "$repo/requirements-jazzy.txt" > "$dir/requirements.txt"
    echo "pytest==$PYTEST_VERSION" >> "$dir/requirements.txt"
  else
    cp "$repo/requirements-jazzy.txt" "$dir/requirements.txt"
  fi
  "$dir/venv/bin/python" -m pip install --quiet -r "$dir/requirements.txt" colcon-common-extensions
  "$dir/venv/bin/python" -m pip install --quiet --no-deps gtsam==4.3.0
fi

rm -rf "$dir/ws"
mkdir -p "$dir/ws/src/mbfg_ros"
(cd "$repo" && git ls-files -co --exclude-standard | while read -r f; do [ -e "$f" ] && echo "$f"; done \
   | tar -cf - -T -) | tar -xf - -C "$dir/ws/src/mbfg_ros"

cd "$dir/ws"
# shellcheck disable=SC1091
source "$dir/venv/bin/activate"
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST ROS_LOCALHOST_ONLY=1 MPLBACKEND=Agg
colcon build --packages-select mbfg_ros
set +u
# shellcheck disable=SC1091
source install/setup.bash
set -u
colcon test --packages-select mbfg_ros "$@"
colcon test-result --verbose
