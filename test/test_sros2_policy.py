"""config/sros2_policy.xml, the SROS2 access control policy shipped for the nodes (docs/ros2_interfaces.md,
"Security (SROS2)"), against the nodes themselves: every topic each running node publishes or subscribes to and every
service it answers is allowed in its enclave (else SROS2 with ROS_SECURITY_STRATEGY=Enforce would cut it
off), and the operator enclave may call exactly the estimator's services.  (The PyPI wheels' Fast DDS has
no security plugins: the policy is checked against the ROS graph here, not enforced.)"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from ros_helpers import CONFIG, REPO, Probe, RosProcess, estimator_process, fresh_domain_id, rclpy_available, wait_until

POLICY = REPO / "config" / "sros2_policy.xml"
ENCLAVES = {"/mbfg/estimator", "/mbfg/plant", "/mbfg/operator"}


def _rules(profile, kind: str, attr: str) -> set:
    """The names `profile` ALLOWs for `attr` ('publish', 'subscribe', 'reply', 'request')."""
    tag, item = ("topics", "topic") if kind == "topics" else ("services", "service")
    return {e.text.strip() for rules in profile.findall(tag) if rules.get(attr) == "ALLOW"
            for e in rules.findall(item)}


def _profiles() -> dict:
    """{(enclave path, node name): profile element} of the policy, checked for the policy format's shape."""
    root = ET.parse(POLICY).getroot()
    assert root.tag == "policy" and root.get("version") == "0.2.0"
    found = {}
    for enclave in root.find("enclaves").findall("enclave"):
        for profile in enclave.find("profiles").findall("profile"):
            assert profile.get("ns") == "/" and profile.get("node")
            found[(enclave.get("path"), profile.get("node"))] = profile
    assert {path for path, _ in found} == ENCLAVES
    return found


def test_the_plant_profiles_differ_only_in_the_plant_name():
    profiles = _profiles()
    def names(node):
        p = profiles[("/mbfg/plant", node)]
        return {(k, a): {n.replace(f"/{node}/", "/PLANT/") for n in _rules(p, k, a)}
                for k, a in (("topics", "publish"), ("topics", "subscribe"), ("services", "reply"))}
    assert names("four_bar_sim") == names("pick_and_place_sim")


@pytest.mark.skipif(not rclpy_available(), reason="rclpy and the ROS 2 message packages are not installed")
def test_every_interface_of_the_running_nodes_is_allowed(tmp_path):
    profiles = _profiles()
    dom = fresh_domain_id()
    # every optional interface on: /clock on both sides, the effort array, standard deviations, covariance
    est = estimator_process(dom, tmp_path / "est.log", params={"use_sim_time": True, "publish_stddev": True,
                                                                "publish_covariance": True})
    plant = RosProcess("mbfg_ros.ros.sim_node", ["--params-file", str(CONFIG), "-p", "publish_clock:=true",
                                                 "-p", "publish_effort_array:=true"], dom, tmp_path / "plant.log")
    probe = Probe(dom)
    try:
        node = probe.node
        nodes = {"mbfg_estimator": "/mbfg/estimator", "four_bar_sim": "/mbfg/plant"}

        def graph(name):
            return (sorted(t for t, _ in node.get_publisher_names_and_types_by_node(name, "/")),
                    sorted(t for t, _ in node.get_subscriber_names_and_types_by_node(name, "/")),
                    sorted(t for t, _ in node.get_service_names_and_types_by_node(name, "/")))

        # discovery comes entity by entity: wait until the last of each kind is seen (the optional ones too)
        last_seen = {"mbfg_estimator": ("/mbfg_estimator/joint_states_covariance", "/clock", "/mbfg_estimator/reset"),
                     "four_bar_sim": ("/four_bar_sim/truth_state", None, "/four_bar_sim/set_parameters")}

        def complete():
            try:
                return all(all(x is None or x in names for x, names in zip(last_seen[n], graph(n))) and
                           len(graph(n)[2]) >= 7 for n in nodes)
            except Exception:  # noqa: BLE001  (a node not discovered yet)
                return False
        assert wait_until(complete, 60, 0.2), f"{est.output()[-2000:]}\n{plant.output()[-2000:]}"
        for name, enclave in nodes.items():
            profile = profiles[(enclave, name)]
            pubs, subs, services = graph(name)
            assert set(pubs) <= _rules(profile, "topics", "publish"), (name, set(pubs) - _rules(profile, "topics", "publish"))
            assert set(subs) <= _rules(profile, "topics", "subscribe"), (name, set(subs) - _rules(profile, "topics", "subscribe"))
            assert set(services) <= _rules(profile, "services", "reply"), (name, set(services) - _rules(profile, "services", "reply"))
        operator = profiles[("/mbfg/operator", "mbfg_operator")]
        assert _rules(operator, "services", "request") == set(graph("mbfg_estimator")[2])
    finally:
        probe.close()
        est.stop()
        plant.stop()
