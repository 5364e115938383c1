"""Propagation on a real node: from a ConfigMap change to the new content read inside running
pods, four ways.

- `kubelet`: nothing but the kubelet. The pods mount the ConfigMap as a directory in a namespace
  configpin does not act in; the kubelet rewrites the files at its next sync of each pod (its
  sync period, 1 minute, plus jitter).
- `nudge`: the kubelet, with an annotation of each pod patched by this bench right after the
  change (what configpin's refresh does, without configpin in between): the floor for refresh.
- `refresh`: configpin with `configpin.io/on-change: refresh`: it patches an annotation on each
  running pod, which makes the kubelet sync that pod at once. Same pods, no restart.
- `roll`: configpin's default: the pod template is re-stamped, the Deployment rolls, and the new
  pods read the new content when they start. Each change goes to a Deployment of its own, so
  that configpin's minimum interval between two rollouts of one workload (30 s) stays out of
  the figure.

The node, its control plane and configpin come from the test harness: harness/node.py starts a
node (containerd, kubelet, kube-proxy, scheduler) and harness/release.py installs
charts/configpin with `helm install`, only the image values changed, for the image that
harness/images.py builds. The readers (harness/apps.py) log each change of what they read with
the kernel's boot-time clock, the one this process reads too, so each pod's figure is the time
from just before the ConfigMap update to the first line in that pod's log that shows the new
content (the reader looks every 0.1 s).

    KUBEBUILDER_ASSETS=$(hack/provision-control-plane.sh --node 1.36.2) \\
      .venv/bin/python -m bench.propagation [--changes 5] [--pods 3] [--modes kubelet,roll]

Prints, per mode, the number of changes and pods and the median and maximum over every
(change, pod) pair; `--json` prints them as JSON too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client

from harness import images
from harness.apps import (
    boottime,
    parse_seen,
    pod_log,
    reader_workload,
    wait_all_read,
    wait_deployment,
    workload_pods,
)
from harness.controlplane import ENABLED_LABEL, default_service_account_ready, wait_for
from harness.node import Node, running_node
from harness.release import installed
from webhook.core.constants import ANN_ON_CHANGE, ON_CHANGE_REFRESH

MODES = ("kubelet", "nudge", "refresh", "roll")
NUDGE = "bench.configpin.io/nudge"
FILE = "/config/greeting"
# The kubelet alone may take its whole sync period plus jitter, and the cache's delay.
KUBELET_TIMEOUT = 180.0
# A pod syncs its volumes several times in its first seconds (probes, status updates), which
# delivers a change made then within a second, kubelet alone: the first change waits until the
# pods are past that, as long-running pods are (seen here: a change 0.2 s after the pods first
# read gave 0.16 s, 1.3 s after gave 0.9 s, a minute after gave 65-70 s).
SETTLE = 15.0
GAP = 2.0  # the chart's controller.coalesceWindowSeconds


@dataclass
class Figures:
    mode: str
    changes: int
    pods: int
    seconds: list[float]

    def line(self) -> str:
        s = sorted(self.seconds)
        return (
            f"{self.mode:<8} {self.changes:>3} changes x {self.pods} pods: "
            f"median {statistics.median(s):6.2f}s  max {s[-1]:6.2f}s  min {s[0]:6.2f}s"
        )


def _namespace(api: client.ApiClient, name: str, *, opted_in: bool) -> str:
    labels = {ENABLED_LABEL: "true"} if opted_in else {}
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name, "labels": labels}})
    wait_for(lambda: default_service_account_ready(api, name), timeout=30, what=f"{name} ready")
    return name


def _source(api: client.ApiClient, namespace: str, name: str, value: str) -> None:
    client.CoreV1Api(api).create_namespaced_config_map(
        namespace, {"metadata": {"name": name}, "data": {"greeting": value}}
    )


def _change(api: client.ApiClient, namespace: str, name: str, value: str) -> float:
    """Update the ConfigMap; the boot-time clock just before."""
    at = boottime()
    client.CoreV1Api(api).patch_namespaced_config_map(
        name, namespace, {"data": {"greeting": value}}
    )
    return at


def _first_read(api: client.ApiClient, namespace: str, pod: str, value: str) -> float | None:
    for seen in parse_seen(pod_log(api, namespace, pod)):
        if seen.values.get(f"file:{FILE}") == value:
            return seen.at
    return None


def _deploy(
    api: client.ApiClient, namespace: str, name: str, pods: int, annotations: dict[str, str]
) -> None:
    manifest = reader_workload(
        "Deployment",
        name,
        images.SHELL.ref,
        configmap=name,
        files=["greeting"],
        replicas=pods,
        annotations=annotations,
    )
    client.AppsV1Api(api).create_namespaced_deployment(namespace, manifest)
    wait_deployment(api, namespace, name)
    wait_all_read(api, namespace, name, {f"file:{FILE}": "v0"})


def _in_place(
    api: client.ApiClient,
    namespace: str,
    changes: int,
    pods: int,
    annotations: dict[str, str],
    *,
    nudge: bool = False,
    gap: float = 0.0,
) -> list[float]:
    """Changes to one ConfigMap that running pods read in place (kubelet, nudge, refresh),
    `gap` seconds apart once the last one was read."""
    _source(api, namespace, "app", "v0")
    _deploy(api, namespace, "app", pods, annotations)
    running = [p.metadata.name for p in workload_pods(api, namespace, "app")]
    core = client.CoreV1Api(api)
    time.sleep(SETTLE)
    seconds = []
    for i in range(1, changes + 1):
        if i > 1:
            time.sleep(gap)  # each change a single edit, not the tail of a burst
        value = f"v{i}"
        at = _change(api, namespace, "app", value)
        if nudge:
            for pod in running:
                patch = {"metadata": {"annotations": {NUDGE: value}}}
                core.patch_namespaced_pod(pod, namespace, patch)
        for pod in running:

            def read(pod: str = pod, value: str = value) -> float | None:
                return _first_read(api, namespace, pod, value)

            what = f"{pod} reading {value}"
            seconds.append(wait_for(read, timeout=KUBELET_TIMEOUT, interval=0.2, what=what) - at)
        _say(f"  change {i}: " + ", ".join(f"{s:.2f}" for s in seconds[-pods:]))
    assert {p.metadata.name for p in workload_pods(api, namespace, "app")} == set(running)
    return seconds


def _rolled(api: client.ApiClient, namespace: str, changes: int, pods: int) -> list[float]:
    """Each change to a Deployment of its own; the new pods' first reads of the new content."""
    seconds = []
    for i in range(1, changes + 1):
        name = f"app-{i}"
        _source(api, namespace, name, "v0")
        _deploy(api, namespace, name, pods, {})
        old = {p.metadata.uid for p in workload_pods(api, namespace, name)}
        at = _change(api, namespace, name, "v1")

        def all_new(name: str = name, old: set[str] = old) -> list[float] | None:
            found = [p for p in workload_pods(api, namespace, name) if p.metadata.uid not in old]
            if len(found) < pods:
                return None
            reads = []
            for pod in found:
                try:
                    read = _first_read(api, namespace, pod.metadata.name, "v1")
                except client.ApiException:
                    return None  # not started yet
                if read is None:
                    return None
                reads.append(read)
            return reads

        reads = wait_for(all_new, timeout=180, interval=0.2, what=f"{name}'s new pods")
        seconds += [r - at for r in reads]
        _say(f"  change {i}: " + ", ".join(f"{s:.2f}" for s in seconds[-pods:]))
    return seconds


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(
    node: Node, modes: Sequence[str], changes: int, pods: int, gap: float = GAP
) -> list[Figures]:
    found = []
    with node.plane.api_client() as api:
        plans: dict[str, Callable[[str], list[float]]] = {
            "kubelet": lambda ns: _in_place(api, ns, changes, pods, {}, gap=gap),
            "nudge": lambda ns: _in_place(api, ns, changes, pods, {}, nudge=True, gap=gap),
            "refresh": lambda ns: _in_place(
                api, ns, changes, pods, {ANN_ON_CHANGE: ON_CHANGE_REFRESH}, gap=gap
            ),
            "roll": lambda ns: _rolled(api, ns, changes, pods),
        }
        for mode in modes:
            _say(f"{mode}: {changes} changes, {pods} pods")
            opted_in = mode in ("refresh", "roll")
            namespace = _namespace(api, f"propagation-{mode}", opted_in=opted_in)
            figures = Figures(mode, changes, pods, plans[mode](namespace))
            _say(figures.line())
            found.append(figures)
            client.CoreV1Api(api).delete_namespace(namespace)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.propagation", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--changes", type=int, default=5, help="changes per mode (default 5)")
    parser.add_argument("--pods", type=int, default=3, help="pods per workload (default 3)")
    parser.add_argument("--modes", default=",".join(MODES), help=",".join(MODES))
    parser.add_argument(
        "--gap",
        type=float,
        default=GAP,
        help="seconds between one change being read everywhere and the next (default "
        f"{GAP:g}: the chart's coalescing window, so that each change is a single edit, not "
        "the tail of a burst, which refresh folds into one pass when the window ends)",
    )
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")

    archives = [images.ensure(images.PAUSE), images.ensure(images.SHELL)]
    configpin_image = images.ensure(images.CONFIGPIN)
    with (
        tempfile.TemporaryDirectory(prefix="propagation-") as tmp,
        running_node(Path(tmp), images=archives, pause_image=images.PAUSE.ref) as node,
    ):
        _say(f"node: Kubernetes 1.{node.minor} Ready in {node.startup_seconds:.1f}s")
        started = time.monotonic()
        with installed(node, configpin_image, images.CONFIGPIN.ref) as release:
            with node.plane.api_client() as api:
                release.wait_ready(api)
            _say(f"configpin installed by helm in {time.monotonic() - started:.1f}s")
            figures = run(node, modes, args.changes, args.pods, args.gap)
    print(f"Kubernetes 1.{node.minor}, one node; change -> new content read inside the pods")
    for f in figures:
        print(f.line())
    if args.json:
        print(json.dumps([f.__dict__ for f in figures]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
