"""The pure parts of the node harness (harness/node.py, harness/apps.py): address layout,
reader log lines, the machine-state comparison."""

from __future__ import annotations

import ipaddress

from harness.apps import parse_seen
from harness.node import POOL, NodeAddresses, state_diff


def test_a_nodes_addresses_stay_in_its_block_and_apart() -> None:
    block = ipaddress.ip_network("10.234.7.0/24")
    a = NodeAddresses(block)
    pods = ipaddress.ip_network(a.pod_cidr)
    services = ipaddress.ip_network(a.service_cidr)
    link = ipaddress.ip_network(f"{a.host_end}/30", strict=False)
    assert block.subnet_of(POOL)
    assert all(net.subnet_of(block) for net in (pods, services, link))
    assert not pods.overlaps(services) and not services.overlaps(link) and not pods.overlaps(link)
    assert ipaddress.ip_address(a.node_ip) in pods
    assert {ipaddress.ip_address(a.host_end), ipaddress.ip_address(a.node_end)} == set(link.hosts())
    assert all(ipaddress.ip_address(x).is_private for x in (a.node_ip, a.host_end, a.node_end))


def test_reader_lines_are_parsed_and_other_lines_ignored() -> None:
    log = "\n".join(
        [
            "starting",
            "seen 1417.95 file:/config/greeting=hello env:MOOD=calm",
            "seen 1418.05 file:/config/greeting= env:MOOD=calm",
            "seen garbage",
        ]
    )
    first, second = parse_seen(log)
    assert first.at == 1417.95
    assert first.file("/config/greeting") == "hello"
    assert first.env("MOOD") == "calm"
    assert second.file("/config/greeting") == ""


def test_state_diff_names_what_appeared_and_what_went() -> None:
    before = {"links": ["lo", "eth0"], "mounts": ["/run tmpfs tmpfs"]}
    after = {"links": ["lo", "eth0", "cpnode-abc123"], "mounts": []}
    assert state_diff(before, after) == {
        "links": ["cpnode-abc123"],
        "mounts": ["-/run tmpfs tmpfs"],
    }
    assert state_diff(before, before) == {}
