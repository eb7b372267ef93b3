#!/usr/bin/env python3
"""Benchmark of the `estimator` node as a real ROS 2 node (over DDS, no ROS installation needed).

    python bench/node_latency.py [--duration 5] [--cases four_bar_1ms,four_bar_2ms,robot_5ms] [--md out/node_latency.md]

For each case it runs `mbfg_ros.ros.demo.run_demo` or `run_with_plant` (estimator + simulated plant as subprocesses, an
in-process probe) and reports: achieved output rate, missing outputs, input-to-output latency
(publish time of the estimate — its DDS source timestamp — minus the stamp of its inputs, same
machine clock: median / p99 / max; and the same up to the probe's receipt), late steps (published
more than dt after the input stamp), the node's mean solve time, the estimation error against the simulated
truth, and the CPU share of each process.  `--overhead` also measures the node's own per-step cost
(message parsing, scheduling, publishing) with the estimator replaced by a no-op, without DDS.

Numbers depend heavily on the machine and its load: run it on an otherwise idle machine.  To measure
a loaded one on purpose, `--busy N` runs N busy-looping processes during each case (and `--param
NAME=VALUE` passes estimator parameters), e.g. the adaptive input wait against the fixed one:

    python bench/node_latency.py --cases four_bar_1ms --duration 8 --busy 2
    python bench/node_latency.py --cases four_bar_1ms --duration 8 --busy 2 --param adaptive_input_delay=false

`--core-cost STEP_US[:PREPARE_US],...` runs each case once per listed cost with the estimator's core
replaced by a stand-in that only burns that much CPU per step (`bench/stub_core_node.py`: STEP_US
between the inputs and the output, PREPARE_US after publishing, 0 if not given; `real`: the real
core), the rest of the node and the machine as in a real run: the latency the node would have with a
core that fast (the error columns then mean nothing).  E.g. the machine's floor, a sweep, and the
real core interleaved with them:

    python bench/node_latency.py --cases four_bar_1ms --core-cost 0,100:30,200:55,300:80,400:110,real

`--consumers` adds, in processes of their own, the subscribers of a real deployment (`bench/consumer.py`:
a controller on `~/joint_states`, reliable, and a recorder on `~/state`), and reports per consumer the
estimates it saw (distinct stamps against one per dt over its span: missing %) and its stamp-to-receipt
delay.  The stand-in core against the real one, both with consumers, interleaved in one run:

    python bench/node_latency.py --cases four_bar_1ms --core-cost 0,real --consumers --rounds 3

`--compare NAME=V1,V2,...` runs each (case, core cost) once per value of one estimator parameter, interleaved
(one row each, the value in the case's name), e.g. the fast loop under normal scheduling against SCHED_FIFO:

    python bench/node_latency.py --cases four_bar_1ms,robot_2ms --core-cost 0,real --consumers --rounds 3 \
        --compare thread_priority=0,50

`--dds-profile XML[,XML...]` gives the estimator's process (only) a Fast DDS XML profile, one run per listed
profile ('none': without), interleaved with the rest, e.g. one giving its receive threads a real-time policy
(docs/ros2_interfaces.md, "Real-time priority").
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# (topic, message type, reliability) of each consumer `--consumers` starts
CONSUMERS = (("/mbfg_estimator/joint_states", "JointState", "reliable"),
             ("/mbfg_estimator/state", "JointTrajectory", "reliable"))

CASES = {
    "four_bar_1ms": dict(mechanism="four_bar_crank", dt=0.001),
    "four_bar_2ms": dict(mechanism="four_bar_crank", dt=0.002),
    "four_bar_1ms_fd": dict(mechanism="four_bar_crank", dt=0.001, mode="forward_dynamics"),
    "robot_5ms": dict(mechanism="pick_and_place_robot", dt=0.005),
    "robot_2ms": dict(mechanism="pick_and_place_robot", dt=0.002),
}


def node_overhead(steps: int = 400) -> float:
    """µs per step spent in the node itself (estimator replaced by a no-op), no DDS involved."""
    import rclpy
    from rclpy.serialization import serialize_message
    from sensor_msgs.msg import JointState
    import mbfg_ros.ros.node as N
    from bench.stub_core_node import StubCore

    os.environ.setdefault("ROS_DOMAIN_ID", "99")
    ctx_args = ["--ros-args", "--params-file", str(REPO / "config" / "four_bar.yaml"), "-p", "publish_markers:=false",
                "-p", "future_tolerance:=100.0"]
    rclpy.init(args=ctx_args)
    for var in ("MBFG_STUB_STEP_US", "MBFG_STUB_PREPARE_US"):
        os.environ.pop(var, None)          # (set by --core-cost) the stand-in costs nothing here
    try:
        node = N.EstimatorNode(core_factory=StubCore)
        t0 = node.now_ns() + 1_000_000_000   # ahead of the clock (future_tolerance 100 s): building the
        #                                     messages takes a while, and stamps behind it would be skipped

        def js(k, names, pos=(), vel=(), eff=()):
            m = JointState()
            st = t0 + k * 1_000_000
            m.header.stamp.sec, m.header.stamp.nanosec = st // 1_000_000_000, st % 1_000_000_000
            m.name, m.position, m.velocity, m.effort = list(names), list(pos), list(vel), list(eff)
            return m
        # the node takes its JointState inputs serialized
        obs = [serialize_message(js(k, ["crank", "coupler_gyro"], [0.1, float("nan")], [float("nan"), 0.2]))
               for k in range(steps)]
        eff = [serialize_message(js(k, ["crank"], eff=[1.0])) for k in range(steps)]
        t = time.perf_counter()
        for k in range(steps):
            node.on_observations(obs[k])
            node.on_effort_joint_state(eff[k])
            node.after_batch()
            node.on_step_timer()
        per = (time.perf_counter() - t) / steps * 1e6
        node.destroy_node()
        return per
    finally:
        rclpy.shutdown()


def _start_consumers(domain_id: int, folder: Path) -> list:
    import subprocess
    from mbfg_ros.ros.demo import ros_env
    procs = []
    for i, (topic, kind, rel) in enumerate(CONSUMERS):
        out = folder / f"consumer_{i}.json"
        out.unlink(missing_ok=True)
        procs.append((subprocess.Popen([sys.executable, str(REPO / "bench" / "consumer.py"), "--topic", topic,
                                        "--type", kind, "--reliability", rel, "--out", str(out)],
                                       env=ros_env(domain_id), cwd=str(REPO)), out, topic))
    time.sleep(1.0)         # discovery: the consumers are matched before the plant starts
    return procs


def _stop_consumers(procs, dt: float) -> list:
    import json
    from mbfg_ros.ros.demo import stop_process
    seen = []
    for p, out, topic in procs:
        stop_process(p, timeout=15.0)
        r = json.loads(out.read_text()) if out.exists() else {"received": 0, "distinct": 0}
        span = ((r["last_stamp"] - r["first_stamp"]) / 1e9) if r.get("first_stamp") is not None else 0.0
        expected = int(round(span / dt)) + 1 if span > 0 else 0
        r["missing_percent"] = 100.0 * max(0, expected - r["distinct"]) / expected if expected else float("nan")
        r["topic"] = topic
        seen.append(r)
    return seen


def _parse_costs(text: str, error) -> list:
    """`--core-cost` as [(step_us, prepare_us) or None (the real core: item `real`), ...]; [None] when
    empty."""
    if not text.strip():
        return [None]
    costs = []
    for item in text.split(","):
        if item.strip() == "real":
            costs.append(None)
            continue
        parts = item.strip().split(":")
        try:
            values = [float(x) for x in parts]
        except ValueError:
            values = []
        if len(values) not in (1, 2) or any(not (0 <= x <= 1e6) for x in values):
            error(f"--core-cost expects STEP_US[:PREPARE_US] items of 0..1e6 µs (got {item!r})")
        costs.append((values[0], values[1] if len(values) == 2 else 0.0))
    return costs


def _parse_compare(text: str, error) -> list:
    """`--compare NAME=V1,V2,...` as [(NAME, V1), (NAME, V2), ...]; [None] when empty."""
    if not text.strip():
        return [None]
    name, sep, values = text.partition("=")
    values = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not name.strip() or not values:
        error(f"--compare expects NAME=V1,V2,... (got {text!r})")
    return [(name.strip(), v) for v in values]


def _parse_profiles(text: str, error) -> list:
    """`--dds-profile` as [absolute path or None (no profile), ...]; [None] when empty."""
    profiles = []
    for item in (text.split(",") if text.strip() else ["none"]):
        item = item.strip()
        if item == "none":
            profiles.append(None)
        elif not Path(item).is_file():
            error(f"--dds-profile: no such file {item!r}")
        else:
            profiles.append(str(Path(item).resolve()))
    return profiles


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--cases", default="four_bar_1ms,four_bar_2ms,robot_5ms",
                    help=f"comma-separated, from {', '.join(CASES)}")
    ap.add_argument("--md", help="also write the table (markdown) to this file")
    ap.add_argument("--plots", default="out", help="folder for one plot per case ('' = none)")
    ap.add_argument("--overhead", action="store_true", help="also measure the node's own per-step cost")
    ap.add_argument("--services", type=int, default=0, metavar="N",
                    help="also call ~/reinitialize and ~/set_assembly_mode N times during each run and report "
                         "their response times (those runs' latencies include the re-initializations)")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="another estimator parameter, as for -p NAME:=VALUE (repeatable), e.g. "
                         "adaptive_input_delay=false")
    ap.add_argument("--busy", type=int, default=0, metavar="N",
                    help="run N busy-looping processes during each case (a loaded machine: the inputs arrive "
                         "late and the node competes for the cores)")
    ap.add_argument("--core-cost", default="", metavar="STEP_US[:PREPARE_US],...",
                    help="run each case with the core replaced by a stand-in burning this much CPU per step "
                         "(see the module doc), once per listed cost ('real': the real core)")
    ap.add_argument("--consumers", action="store_true",
                    help="also run the consumers of a real deployment in processes of their own (see the module "
                         "doc) and report what each saw")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the list of core costs this many times, "
                    "interleaved (one row per run)")
    ap.add_argument("--compare", default="", metavar="NAME=V1,V2,...",
                    help="run each case and core cost once per value of this estimator parameter, interleaved "
                         "(e.g. thread_priority=0,50)")
    ap.add_argument("--dds-profile", default="", metavar="XML[,XML...]",
                    help="a Fast DDS XML profile for the estimator's process only (FASTDDS_DEFAULT_PROFILES_FILE), "
                         "e.g. one that sets its receive threads' scheduling; several (comma-separated, 'none' = "
                         "no profile): each run once per profile, interleaved as --compare")
    a = ap.parse_args(argv)
    costs = _parse_costs(a.core_cost, ap.error)
    variants = [(v, p) for v in _parse_compare(a.compare, ap.error) for p in _parse_profiles(a.dds_profile, ap.error)]
    import subprocess
    import numpy as np
    from mbfg_ros.ros.demo import ESTIMATOR_NODE, parse_params, run_with_plant
    params = parse_params(a.param, ap.error)
    rows = []
    import random
    import tempfile
    consumer_rows = []
    for case in a.cases.split(","):
        c = CASES[case.strip()]
        for cost, (variant, profile) in [(c_, v_) for c_ in costs for v_ in variants] * max(1, a.rounds):
            name = case if cost is None else f"{case}, stub core {cost[0]:g}+{cost[1]:g} µs"
            run_params = dict(params)
            if variant is not None:
                name += f", {variant[0]}={variant[1]}"
                run_params[variant[0]] = variant[1]
            if a.dds_profile:
                name += f", DDS profile {Path(profile).name if profile else 'none'}"
            estimator_env = {"FASTDDS_DEFAULT_PROFILES_FILE": profile} if profile else {}
            print(f"=== {name}")
            plot = str(Path(a.plots) / f"node_latency_{case}.png") if a.plots and cost is None else None
            module = ESTIMATOR_NODE
            if cost is not None:
                module = "bench.stub_core_node"
                os.environ["MBFG_STUB_STEP_US"], os.environ["MBFG_STUB_PREPARE_US"] = str(cost[0]), str(cost[1])
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
            domain_id = random.randint(1, 100)
            consumers = (_start_consumers(domain_id, Path(tempfile.mkdtemp(prefix="mbfg_consumers_")))
                         if a.consumers else [])
            try:
                r = run_with_plant(module, a.duration, c["mechanism"], mode=c.get("mode"), dt=c["dt"], plot=plot,
                                   service_calls=a.services, params=run_params, verbose=cost is None,
                                   estimator_env=estimator_env,
                                   domain_id=domain_id)
            finally:
                for b in busy:
                    b.kill()
                    b.wait()
                seen = _stop_consumers(consumers, c["dt"])
            for s in seen:
                consumer_rows.append((name, s))
            if cost is not None:
                r["errors"] = {}          # a constant pose: its errors mean nothing
            rows.append((name, r))
    lines = ["| case | mode | dt | output rate | missing | latency to publish median / p99 / max | "
             "to a subscriber median / p99 | late steps | "
             "solve (node) | q error rms / max | effort error rms | CPU est / plant / probe |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows:
        L, e, d, cpu = r["latency_ms"], r.get("errors", {}), r.get("node_diagnostics", {}), r["cpu_share"]
        R = r["delivery_latency_ms"]
        lines.append(
            f"| {name} | {d.get('mode', '?')} | {r['dt'] * 1e3:g} ms | {r['output_rate_hz']:.0f} Hz | "
            f"{r['missing_percent']:.1f} % | {L['median']:.2f} / {L['p99']:.2f} / {L['max']:.1f} ms | "
            f"{R['median']:.2f} / {R['p99']:.2f} ms | "
            f"{r['late_percent']:.1f} % | {float(d.get('solve_ms_mean', 'nan')):.2f} ms | "
            f"{e.get('q_rms', float('nan')):.1e} / {e.get('q_max', float('nan')):.1e} | "
            f"{e.get('effort_rms', float('nan')):.1e} | "
            f"{cpu['estimator'] * 100:.0f} / {cpu['plant'] * 100:.0f} / {cpu['probe'] * 100:.0f} % |")
    table = "\n".join(lines)
    if consumer_rows:
        table += ("\n\n| case | consumer (own process) | received | distinct estimates | missing | "
                  "stamp -> receipt median / p99 |\n|---|---|---|---|---|---|")
        for name, s in consumer_rows:
            table += (f"\n| {name} | {s['topic']} | {s['received']} | {s['distinct']} | "
                      f"{s['missing_percent']:.1f} % | {s.get('delay_ms_median') or float('nan'):.2f} / "
                      f"{s.get('delay_ms_p99') or float('nan'):.2f} ms |")
    if a.services:
        table += ("\n\n| case | service | calls | round trip median / max (client) | handling median / max "
                  "(node) |\n|---|---|---|---|---|")
        for name, r in rows:
            sv = r.get("services") or {}
            h = sv.get("handling_ms") or [float("nan")]
            for srv, rts in (sv.get("round_trip_ms") or {}).items():
                if rts:
                    table += (f"\n| {name} | ~/{srv} | {len(rts)} | {np.median(rts):.2f} / {max(rts):.2f} ms | "
                              f"{np.median(h):.2f} / {max(h):.2f} ms |")
            if sv.get("failures"):
                table += f"\n\n{name}: service failures: {sv['failures']}"
    if a.overhead:
        table += f"\n\nNode overhead per step (no estimator, no DDS): {node_overhead():.0f} µs"
    load = os.getloadavg()
    table += f"\n\n{os.cpu_count()} CPUs, load average before/after: {load[0]:.2f} (1 min)"
    if a.busy:
        table += f"; {a.busy} busy-looping process(es) competing during each case"
    if params:
        table += f"; estimator parameters {params}"
    if a.dds_profile:
        table += f"; DDS profiles (estimator only): {a.dds_profile}"
    print(table)
    if a.md:
        Path(a.md).parent.mkdir(parents=True, exist_ok=True)
        Path(a.md).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
