"""The dashboard at scale, in the real browser: how long each view takes to be usable with
1,000 workloads and 200 sources in the namespace (issue 39: under 1 s).

A control plane and configpin (the test harness, registered as the chart registers it), one
namespace with 200 ConfigMaps and 1,000 Deployments (no pods), each reading a key of one of
them and the key `level` of ConfigMap `shared`; then one change of `shared`, which configpin
rolls to all 1,000 (a change of 1,000 members). `configpin dashboard -n NS` is started as a
user starts it, and Debian's chromium (harness/browser.py) opens each view in a new tab:

- the figure is the time from the start of the navigation (`performance.now()` in the page)
  until the view's rows are drawn (usable: the page has read its JSON and drawn it);
- `workloads, statuses`: until every row of the first page shows its state (50 dry runs of
  `configpin status`, made in the background as the page asks);
- and the JSON answer behind each view, read straight from the dashboard (its size, its time).

    KUBEBUILDER_ASSETS=$(hack/provision-control-plane.sh 1.36.2) \\
      .venv/bin/python -m bench.dashboard [--workloads 1000] [--sources 200] [--loads 5]

Prints, per view, the median and the maximum of `--loads` loads.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

from harness.browser import browser
from harness.configpin import instance_namespace, leading_configpin
from harness.controlplane import running_control_plane, wait_for
from harness.manifests import configmap, container, deployment, env_key_ref, pod_spec
from webhook.kube.raw import MERGE_PATCH, Kube, path

INSTANCE = "bench-dash"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _populate(kube: Kube, ns: str, workloads: int, sources: int) -> None:
    kube.create(path("configmaps", ns), configmap("shared", {"level": "info"}))
    for i in range(sources):
        kube.create(path("configmaps", ns), configmap(f"cfg-{i:03}", {"v": "1", "w": "2"}))

    def make(i: int) -> None:
        spec = pod_spec(
            container(
                env=[
                    env_key_ref("configmap", f"cfg-{i % sources:03}", "v", "V"),
                    env_key_ref("configmap", "shared", "level", "LEVEL"),
                ]
            )
        )
        kube.create(path("deployments", ns), deployment(f"app-{i:04}", spec))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(make, range(workloads)))


def _recorded(kube: Kube, ns: str) -> int:
    page = kube.get(path("deployments", ns))
    return sum(
        1
        for d in page.get("items") or ()
        if "configpin.io/rollout" in (d["metadata"].get("annotations") or {})
    )


@contextlib.contextmanager
def _dashboard(kubeconfig: Path, ns: str) -> Iterator[tuple[str, int]]:
    plugin = str(Path(sys.executable).parent / "kubectl-configpin")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    proc = subprocess.Popen(
        [plugin, "dashboard", "--port", "0", "-n", ns],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("configpin dashboard: http://"):
        proc.kill()
        raise SystemExit(f"the dashboard did not start: {line}{proc.stdout.read()}")
    url = line.split()[2]
    drain = threading.Thread(target=proc.stdout.read, daemon=True)
    drain.start()
    try:
        yield url, int(url.rstrip("/").rsplit(":", 1)[1])
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(15)
        proc.stdout.close()


def _json(port: int, route: str) -> tuple[float, int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    started = time.perf_counter()
    conn.request("GET", route, headers={"Host": f"localhost:{port}"})
    body = conn.getresponse().read()
    took = time.perf_counter() - started
    conn.close()
    return took, len(body), json.loads(body)


def _load(context: Any, url: str, want: str, settled: str | None = None) -> tuple[float, float]:
    """ms from the navigation's start until `want` rows are drawn (and until the page's text
    no longer holds `settled`, if given) in a new tab. (Waited for by selectors and
    evaluations from outside the page: the page's policy forbids the string evaluation
    that Playwright's wait_for_function makes inside it.)"""
    page = context.new_page()
    try:
        page.goto(url, wait_until="commit")
        page.wait_for_selector(f"#view[data-loaded] {want}", timeout=60_000)
        usable = float(page.evaluate("performance.now()"))
        done = usable
        if settled:
            deadline = time.monotonic() + 120
            while settled in page.inner_text("#view") and time.monotonic() < deadline:
                time.sleep(0.05)
            done = float(page.evaluate("performance.now()"))
        return usable, done
    finally:
        page.close()


def measure(url: str, port: int, ns: str, loads: int) -> list[tuple[str, list[float], str]]:
    _, _, changes = _json(port, "/api/changes")
    change = next(c["id"] for c in changes["changes"] if "/shared@" in c["id"])
    routes = {
        "changes": ("#/changes", "tr[data-change]", None, "/api/changes"),
        "change, 1,000 members": (
            "#/change/" + quote(change, safe=""),
            "tr[data-workload]",
            None,
            "/api/change?id=" + quote(change, safe=""),
        ),
        "used by, 201 sources": ("#/sources", "tr[data-source]", None, "/api/sources"),
        "used by, one source": (
            f"#/source/configmap/{ns}/shared",
            "tr[data-consumer]",
            None,
            f"/api/source?kind=configmap&namespace={ns}&name=shared",
        ),
        "workloads": ("#/workloads", "tr[data-workload]", None, "/api/workloads"),
    }
    out = []
    with browser() as context:
        _load(context, url + "#/changes", "tr[data-change]")  # (the browser's first start)
        for name, (hash_, want, _settled, route) in routes.items():
            figures = []
            for _ in range(loads):
                usable, _ = _load(context, url + hash_, want)
                figures.append(usable)
            took, size, _ = _json(port, route)
            note = f"JSON {size / 1024:.0f} KiB in {took * 1000:.0f} ms"
            out.append((name, figures, note))
            _say(f"{name}: {statistics.median(figures):.0f} ms ({note})")
        # the first page's statuses: 50 dry runs, asked when the page first asks
        settled = "asking the API server"
        _, done = _load(context, url + "#/workloads?q=app-09", "tr[data-workload]", settled)
        out.append(("workloads, statuses of a page", [done], "50 dry runs, 4 at a time"))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.dashboard", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--workloads", type=int, default=1000, help="Deployments (default 1000)")
    parser.add_argument("--sources", type=int, default=200, help="ConfigMaps (default 200)")
    parser.add_argument("--loads", type=int, default=5, help="loads of each view (default 5)")
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp,
        running_control_plane(Path(tmp) / "plane") as plane,
        leading_configpin(
            plane,
            Path(tmp) / "configpin",
            instance=INSTANCE,
            webhook_name="configpin-bench-dash",
            args=["--coalesce-window", "0.5", "--min-rollout-interval", "0"],
        ),
        plane.api_client() as api,
        instance_namespace(api, INSTANCE, "dash") as ns,
    ):
        kube = Kube(api)
        started = time.monotonic()
        _populate(kube, ns, args.workloads, args.sources)
        took = time.monotonic() - started
        _say(f"{args.workloads} Deployments, {args.sources + 1} ConfigMaps in {took:.0f} s")
        kube.patch(
            path("configmaps", ns, "shared"), {"data": {"level": "debug"}}, content_type=MERGE_PATCH
        )
        wait_for(
            lambda: _recorded(kube, ns) >= args.workloads,
            timeout=600,
            interval=2.0,
            what="every Deployment rolled for the change",
        )
        _say(f"the change rolled to all in {time.monotonic() - started:.0f} s")
        with _dashboard(plane.kubeconfig, ns) as (url, port):
            wait_for(lambda: _json(port, "/api/overview")[2]["ready"], what="the dashboard read")
            figures = measure(url, port, ns, args.loads)
    print(
        f"Kubernetes 1.{plane.minor}; {args.workloads} workloads, {args.sources + 1} sources; "
        "ms from navigation start to the view drawn, in chromium"
    )
    for name, values, note in figures:
        print(
            f"{name:<32} median {statistics.median(values):6.0f} ms  max {max(values):6.0f} ms  "
            f"({len(values)} loads; {note})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
