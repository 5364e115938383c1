"""Safe delivery: from a failure signal to the undo patch, and the wave schedule of one change
reaching many Deployments.

Starts the test control plane (etcd, kube-apiserver, kube-controller-manager; no kubelet)
and configpin as a process, its webhook registered as the chart registers it, every write of
its controller through admission, as in a cluster.

1. Undo: a snapshot-mode Deployment whose pods never become Ready (nothing runs them), with
   `progressDeadlineSeconds` short; each round changes its ConfigMap, configpin rolls it, the
   Deployment controller reports `Progressing=False, ProgressDeadlineExceeded`, configpin
   points the template back at the previous copy. Measured on one watch of the Deployment:
   from the event that carries the failure condition to the event that carries the undone
   template (the condition's own `lastUpdateTime` has one-second resolution).
2. Waves: `--workloads` Deployments of one replica read one ConfigMap; a stand-in kubelet
   (harness.kubelet, following a watch of the pods) reports every pod Ready, so that each
   Deployment is healthy before the change and a rollout completes when its new pod is Ready
   and the old one gone (a workload scaled to zero, or never healthy, vouches for nothing and
   cuts no wave). One change; from that change, when each Deployment's template was
   re-stamped and when its rollout record said complete, on a watch. Printed per wave: its
   size, when its first and last re-stamp landed, when its last rollout completed. Run for
   the default settings (`--rollout-waves 1,10%,100% --max-rolling 50`) and for waves off
   with no cap (every workload at once: what configpin did before safe delivery).

`--baseline REV` runs the same, in the same control plane, with REV's configpin (`git
archive` of its webhook package) and prints both.

    .venv/bin/python -m bench.delivery [--rounds 5] [--workloads 1000] [--version 1.36.2]
        [--baseline REV]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import baseline_tree, control_plane_assets
from harness.configpin import (
    Configpin,
    ensure_namespace,
    instance_namespace,
    running_configpin,
)
from harness.controlplane import ControlPlane, running_control_plane, wait_for
from harness.kubelet import Kubelet
from harness.manifests import configmap, container, deployment, env_key_ref, pod_spec
from webhook.core.constants import ANN_MODE, ANN_ROLLOUT, ANN_SOURCES
from webhook.core.waves import Member, parse_waves, wave_plan
from webhook.kube.client import connect
from webhook.kube.raw import MERGE_PATCH, Kube, path

INSTANCE = "bench-delivery"
DEADLINE = 5


def _args(waves: str, cap: int) -> list[str]:
    return [
        "--coalesce-window", "0",
        "--min-rollout-interval", "0",
        "--rollout-waves", waves,
        "--max-rolling", str(cap),
    ]  # fmt: skip


@contextmanager
def _configpin(
    plane: ControlPlane, work: Path, waves: str, cap: int, repo: Path | None
) -> Iterator[Configpin]:
    kw: dict[str, Any] = {} if repo is None else {"repo": repo}
    with running_configpin(
        plane,
        work,
        args=_args(waves, cap),
        instance=INSTANCE,
        webhook_name="configpin-delivery",
        **kw,
    ) as cp:
        wait_for(lambda: cp.metric("configpin_leader") == 1, what="configpin leading")
        yield cp


def _ref(obj: dict[str, Any]) -> str:
    env = obj["spec"]["template"]["spec"]["containers"][0]["env"][0]
    return str(env["valueFrom"]["configMapKeyRef"]["name"])


def _record(obj: dict[str, Any]) -> dict[str, Any]:
    text = (obj["metadata"].get("annotations") or {}).get(ANN_ROLLOUT)
    return json.loads(text) if text else {}


def _failed_condition(obj: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
        for c in (obj.get("status") or {}).get("conditions") or ()
    ) and (obj.get("status") or {}).get("observedGeneration") == obj["metadata"].get("generation")


class Watch:
    """One watch of a namespace's Deployments, noting when each event arrived."""

    def __init__(self, kube: Kube, ns: str) -> None:
        self.kube, self.ns = kube, ns
        self.events: list[tuple[float, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._rv = kube.get(path("deployments", ns))["metadata"]["resourceVersion"]

    def _run(self) -> None:
        while not self._stop.is_set():
            with self.kube.watch(
                path("deployments", self.ns), self._rv, timeoutSeconds=5
            ) as stream:
                for event in stream:
                    obj = event.get("object") or {}
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self.events.append((time.monotonic(), obj))
                        self._rv = obj["metadata"]["resourceVersion"]
                    if self._stop.is_set():
                        return

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)


def _undone(
    events: list[tuple[float, dict[str, Any]]], before: str
) -> tuple[float, float, float] | None:
    """When this round's re-stamp, then the Deployment's failure signal, then configpin's undo
    were seen, in that order (a late event of the round before, already undone, is no undo)."""
    seen = list(events)
    rolled = next((t for t, o in seen if _ref(o) != before), None)
    if rolled is None:
        return None
    signal = next((t for t, o in seen if t >= rolled and _failed_condition(o)), None)
    if signal is None:
        return None
    undone = next(
        (
            t
            for t, o in seen
            if t >= signal and _ref(o) == before and _record(o).get("state") == "failed"
        ),
        None,
    )
    return None if undone is None else (rolled, signal, undone)


def undo_latency(kube: Kube, api: Any, rounds: int) -> list[float]:
    out = []
    with instance_namespace(api, INSTANCE, "undo") as ns:
        kube.create(path("configmaps", ns), configmap("cfg", {"a": "0"}))
        dep = deployment(
            "web",
            pod_spec(container(env=[env_key_ref("configmap", "cfg", "a", "A")])),
            replicas=1,
            annotations={ANN_MODE: "snapshot"},
        )
        dep["spec"]["progressDeadlineSeconds"] = DEADLINE
        kube.create(path("deployments", ns), dep)
        wait_for(lambda: _ref(kube.get(path("deployments", ns, "web"))).startswith("cfg-"))
        for i in range(1, rounds + 1):
            before = _ref(kube.get(path("deployments", ns, "web")))
            with Watch(kube, ns) as watch:
                kube.patch(
                    path("configmaps", ns, "cfg"), {"data": {"a": str(i)}}, content_type=MERGE_PATCH
                )
                _rolled, signal, undone = wait_for(
                    lambda b=before: _undone(watch.events, b),  # type: ignore[misc]
                    timeout=DEADLINE + 120,
                    what=f"round {i} undone",
                )
            out.append(undone - signal)
            print(
                f"  round {i}: failure signal -> undo {1e3 * (undone - signal):.0f} ms", flush=True
            )
    return out


def _available(d: dict[str, Any]) -> bool:
    status = d.get("status") or {}
    return status.get("observedGeneration", 0) >= d["metadata"]["generation"] and any(
        c.get("type") == "Available" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


def schedule(kube: Kube, api: Any, workloads: int, waves: str) -> dict[str, Any]:
    names = [f"app-{i:04d}" for i in range(workloads)]
    with (
        instance_namespace(api, INSTANCE, "waves") as ns,
        Kubelet(kube, ns, watch=True) as kubelet,
    ):
        kubelet.allow(lambda _pod: True)
        kube.create(path("configmaps", ns), configmap("shared", {"a": "0"}))
        for name in names:
            kube.create(
                path("deployments", ns),
                deployment(
                    name,
                    pod_spec(container(env=[env_key_ref("configmap", "shared", "a", "A")])),
                    replicas=1,
                ),
            )
        wait_for(
            lambda: (
                sum(
                    1
                    for d in kube.get(path("deployments", ns))["items"]
                    if (d["spec"]["template"]["metadata"].get("annotations") or {}).get(ANN_SOURCES)
                )
                == workloads
            ),
            timeout=600,
            what="every Deployment stamped",
        )
        # ... and available, its pod Ready (healthy before the change), and seen by the
        # Deployment controller: the change's rollouts do not queue behind the creations (it
        # writes at --kube-api-qps, 20 by default, as in most clusters).
        wait_for(
            lambda: all(_available(d) for d in kube.get(path("deployments", ns))["items"]),
            timeout=1800,
            interval=2.0,
            what="every Deployment available",
        )
        stamped: dict[str, float] = {}
        complete: dict[str, float] = {}
        with Watch(kube, ns) as watch:
            t0 = time.monotonic()
            kube.patch(
                path("configmaps", ns, "shared"), {"data": {"a": "1"}}, content_type=MERGE_PATCH
            )

            def done() -> bool:
                for t, obj in list(watch.events):
                    name, record = obj["metadata"]["name"], _record(obj)
                    if record and name not in stamped:
                        stamped[name] = t - t0
                    if record.get("state") == "complete" and name not in complete:
                        complete[name] = t - t0
                return len(complete) == workloads

            wait_for(done, timeout=1800, interval=1.0, what="every rollout complete")
    steps = parse_waves(waves)
    plan = wave_plan((Member(0, ns, "Deployment", n) for n in names), steps)
    rows = []
    for wave in plan:
        starts = [stamped[m.name] for m in wave]
        ends = [complete[m.name] for m in wave]
        rows.append(
            {"size": len(wave), "first": min(starts), "last": max(starts), "complete": max(ends)}
        )
    return {"waves": waves, "rows": rows, "all": max(complete.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="undo rounds")
    parser.add_argument("--workloads", type=int, default=1000, help="Deployments for the waves")
    parser.add_argument(
        "--version", default="1.36.2", help="control plane (KUBEBUILDER_ASSETS wins)"
    )
    parser.add_argument("--baseline", help="a revision to measure the same way, beside")
    args = parser.parse_args()
    assets = control_plane_assets(args.version)
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_control_plane(Path(tmp) / "cp", assets) as plane,
    ):
        api = plane.api_client()
        ensure_namespace(api)
        kube = Kube(connect(plane.kubeconfig))
        print(
            f"control plane {args.version}; pods reported Ready by a stand-in kubelet", flush=True
        )
        trees: dict[str, Path | None] = {"this tree": None}
        if args.baseline:
            trees[args.baseline] = baseline_tree(args.baseline, Path(tmp) / "baseline")
        results = []
        for name, repo in trees.items():
            print(f"\n{name}:", flush=True)
            work = Path(tmp) / name.replace(" ", "-")
            with _configpin(plane, work / "a", "1,10%,100%", 50, repo):
                latencies = undo_latency(kube, api, args.rounds)
                default = schedule(kube, api, args.workloads, "1,10%,100%")
            with _configpin(plane, work / "b", "off", 0, repo):
                at_once = schedule(kube, api, args.workloads, "off")
            results.append((name, latencies, default, at_once))
    for name, latencies, default, at_once in results:
        _report(name, args.workloads, latencies, default, at_once)


def _report(
    name: str,
    workloads: int,
    latencies: list[float],
    default: dict[str, Any],
    at_once: dict[str, Any],
) -> None:
    print(f"\n== {name}")
    print(f"failure signal -> undo patch, snapshot mode ({len(latencies)} rounds):")
    print(
        f"  median {1e3 * statistics.median(latencies):.0f} ms, max {1e3 * max(latencies):.0f} ms"
    )
    for result, label in (
        (default, "--rollout-waves 1,10%,100% --max-rolling 50"),
        (at_once, "--rollout-waves off --max-rolling 0"),
    ):
        print(f"\none change, {workloads} Deployments (1 replica each, Ready), {label}:")
        print(f"  {'wave':>4} {'size':>5} {'first stamp':>12} {'last stamp':>11} {'complete':>9}")
        for i, row in enumerate(result["rows"], 1):
            print(
                f"  {i:>4} {row['size']:>5} {row['first']:>11.2f}s {row['last']:>10.2f}s "
                f"{row['complete']:>8.2f}s"
            )
        print(f"  every rollout complete after {result['all']:.2f}s")
    print(f"  waves / at once: x{default['all'] / at_once['all']:.2f}")


if __name__ == "__main__":
    main()
