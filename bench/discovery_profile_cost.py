#!/usr/bin/env python3
"""What the package's Fast DDS profile (config/fastdds_discovery.xml: an announcement every 0.25 s instead
of 3 s) costs an idle process: CPU time of idle rclpy nodes on one domain, with and without it.

    python bench/discovery_profile_cost.py [--nodes 3] [--seconds 20] [--repeat 2]

Each case starts `--nodes` processes that create one node each and spin it for `--seconds`; a process
prints its CPU time after the spin minus before it (imports and start-up left out).  The cases alternate
(without, with, without, ...), each on a fresh domain with loopback discovery.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CHILD = r"""
import sys, time
import rclpy
rclpy.init()
node = rclpy.create_node("mbfg_idle")
cpu0, t_end = time.process_time(), time.monotonic() + float(sys.argv[1])
while time.monotonic() < t_end:
    rclpy.spin_once(node, timeout_sec=0.5)
print(time.process_time() - cpu0)
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args(argv)
    from mbfg_ros.ros.demo import ros_env
    from mbfg_ros.ros.package_files import PROFILE_VARIABLE
    print(f"| case | CPU of each idle node, ms per s ({a.nodes} nodes on the domain, {a.seconds:g} s) |\n|---|---|")
    for _ in range(a.repeat):
        for with_profile in (False, True):
            env = ros_env(random.randint(1, 100))       # the package's profile, unless the environment names one
            if not with_profile:
                env.pop(PROFILE_VARIABLE, None)
            case = env.get(PROFILE_VARIABLE, "Fast DDS defaults")
            procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(a.seconds)], env=env, stdout=subprocess.PIPE,
                                      text=True) for _ in range(a.nodes)]
            cpu = [float(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
            print(f"| {case} | " + ", ".join(f"{1e3 * c / a.seconds:.2f}" for c in cpu) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
