"""RSS of `configpin serve` at rest: with no cluster, and on an empty cluster, beside a
baseline revision and an allow-all FastAPI webhook on the same stack, measured in one run.

    .venv/bin/python -m bench.serve_rss                      # baseline main, 5 runs per target
    .venv/bin/python -m bench.serve_rss --baseline REV --runs 7 --arena-max 2
    .venv/bin/python -m bench.serve_rss --parts              # only the import breakdown

Each run starts a fresh process and reads `/proc/PID/status` (VmRSS, RssAnon, RssFile):

- no cluster: `configpin serve --certs-dir D` (the embedded sources, development certificates
  already in D, as `make run` after its first start), 2 s after its first `/readyz` OK;
- empty cluster: the test control plane (1.36.2 by default, `--version`), `configpin serve
  --kubeconfig ...` as the integration tests start it (certificates from files, controller
  on, leader-elected) with two empty namespaces opted in, 2 s after it leads and its
  controller is up (`configpin_leader` and `configpin_controller_up` = 1);
- the floor: an allow-all webhook (FastAPI, uvicorn with httptools and uvloop, orjson, the
  same TLS files), 2 s after its first `/readyz` OK;
- the baseline: the same commands on another revision's `webhook/` (`git archive`), on the
  same interpreter and installed packages;
- `--arena-max N`: this tree again with `MALLOC_ARENA_MAX=N` (glibc's malloc arenas).

Targets take turns within each round, so load on a shared machine spreads over all of them;
RSS does not move with load the way time does. Medians of `--runs`.

`--parts`: what each import adds, in the order a server needs them, in one fresh interpreter
per step list (VmRSS after each).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import REPO, baseline_tree, control_plane_assets, free_port
from harness.configpin import CONFIGPIN_NAMESPACE, ensure_namespace
from harness.controlplane import ENABLED_LABEL, ControlPlane, running_control_plane
from webhook.tls.certgen import generate
from webhook.tls.certs import write_bundle

FIELDS = ("VmRSS", "RssAnon", "RssFile")
GOAL_MB = 60.0

ALLOW_ALL = """
import sys
import orjson
import uvicorn
from fastapi import FastAPI, Request, Response

app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)


@app.post("/mutate")
async def mutate(request: Request) -> Response:
    review = orjson.loads(await request.body())
    out = {"apiVersion": review["apiVersion"], "kind": "AdmissionReview",
           "response": {"uid": review["request"]["uid"], "allowed": True}}
    return Response(orjson.dumps(out), media_type="application/json")


@app.get("/readyz")
async def readyz() -> Response:
    return Response(b"ok", media_type="text/plain")


uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), http="httptools", loop="uvloop",
            ssl_certfile=sys.argv[2], ssl_keyfile=sys.argv[3], log_level="warning",
            access_log=False)
"""

# (label, statement): imported one after another in one interpreter
PARTS: list[tuple[str, str]] = [
    ("interpreter", "pass"),
    ("ssl, hashlib", "import ssl, hashlib"),
    ("asyncio, uvloop", "import asyncio, uvloop"),
    ("fastapi (pydantic, starlette)", "import fastapi"),
    ("uvicorn, its httptools protocol", "import uvicorn.protocols.http.httptools_impl"),
    ("prometheus_client", "import prometheus_client"),
    ("pydantic_settings", "import pydantic_settings"),
    ("urllib3", "import urllib3"),
    (
        "configpin's own modules (webhook.commands.cli, webhook.commands.serve)",
        "import webhook.commands.cli, webhook.commands.serve",
    ),
    ("yaml (no cluster: the embedded sources)", "import yaml, webhook.inputs.manifests"),
    ("- not imported any more: cryptography.x509", "import cryptography.x509"),
    ("- not imported any more: kubernetes", "import kubernetes"),
]


def status_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in FIELDS:
            out[key] = int(value.split()[0])
    return out


def https_get(url: str, ctx: ssl.SSLContext) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        e.close()
        return e.code, ""


def metric(url: str, ctx: ssl.SSLContext, name: str) -> float:
    _, text = https_get(url + "/metrics", ctx)
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait(what: str, check: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: exited {proc.returncode}\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            if check():
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not after 90 s\n{log.read_text()[-3000:]}")


@dataclass
class Target:
    name: str
    tree: Path | None  # None: the allow-all floor
    env: dict[str, str] = field(default_factory=dict)
    samples: dict[str, list[dict[str, int]]] = field(default_factory=dict)


class Bench:
    def __init__(self, tmp: Path, plane: ControlPlane | None) -> None:
        self.tmp = tmp
        self.plane = plane
        self.certs = tmp / "certs"
        write_bundle(generate("configpin", "configpin"), self.certs)  # dev certs, as `make run`
        self.ctx = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))

    def command(self, target: Target, mode: str, port: int) -> list[str]:
        if target.tree is None:
            return [
                sys.executable,
                "-c",
                ALLOW_ALL,
                str(port),
                str(self.certs / "tls.crt"),
                str(self.certs / "tls.key"),
            ]
        base = [sys.executable, "-m", "webhook", "serve", "--host", "127.0.0.1"]
        base += ["--port", str(port), "--certs-dir", str(self.certs)]
        base += ["--shutdown-delay", "0", "--drain-timeout", "2"]
        if mode == "no cluster":
            return base
        assert self.plane is not None
        return [
            *base,
            "--tls-cert", str(self.certs / "tls.crt"), "--tls-key", str(self.certs / "tls.key"),
            "--kubeconfig", str(self.plane.kubeconfig),
            "--namespace", CONFIGPIN_NAMESPACE,
            "--namespace-selector", f"{ENABLED_LABEL}=true",
            "--lease-name", f"rss-{secrets.token_hex(3)}",
        ]  # fmt: skip

    def measure(self, target: Target, mode: str) -> dict[str, int]:
        port = free_port()
        url = f"https://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "PYTHONPATH")}
        env |= {"PYTHONUNBUFFERED": "1", **target.env}
        if target.tree is not None:
            env["PYTHONPATH"] = str(target.tree)
        log = self.tmp / f"{target.name.replace(' ', '_')}-{port}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                self.command(target, mode, port),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=target.tree or self.tmp,
                env=env,
            )
        try:
            wait("/readyz", lambda: https_get(url + "/readyz", self.ctx)[0] == 200, proc, log)
            if mode != "no cluster" and target.tree is not None:
                wait(
                    "leading, controller up",
                    lambda: (
                        metric(url, self.ctx, "configpin_leader") == 1
                        and metric(url, self.ctx, "configpin_controller_up") == 1
                    ),
                    proc,
                    log,
                )
            time.sleep(2.0)
            return status_kib(proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def mb(kib: float) -> str:
    return f"{kib / 1024:.1f}"


def report(mode: str, targets: list[Target]) -> None:
    print(f"\n{mode}: medians (MB) of {len(targets[0].samples[mode])} runs")
    print(f"{'':44} {'VmRSS':>7} {'RssAnon':>8} {'RssFile':>8}   VmRSS of each run")
    medians = {}
    for t in targets:
        runs = t.samples[mode]
        med = {f: statistics.median(r[f] for r in runs) for f in FIELDS}
        medians[t.name] = med
        each = ", ".join(mb(r["VmRSS"]) for r in runs)
        print(f"{t.name:44} {mb(med['VmRSS']):>7} {mb(med['RssAnon']):>8} "
              f"{mb(med['RssFile']):>8}   {each}")  # fmt: skip
    this = medians["this tree"]["VmRSS"]
    for t in targets[1:]:
        other = medians[t.name]["VmRSS"]
        print(f"  this tree - {t.name}: {mb(this - other)} MB ({this / other:.2f}x)")
    verdict = "met" if this / 1024 <= GOAL_MB else "NOT met"
    print(f"  goal <= {GOAL_MB:.0f} MB: {verdict}")


def parts(tree: Path) -> None:
    code = [
        "import sys",
        "def rss():",
        "    for line in open('/proc/self/status'):",
        "        if line.startswith('VmRSS:'): return int(line.split()[1])",
        "last = rss()",
    ]
    for label, statement in PARTS:
        code += [
            statement,
            "now = rss()",
            f"label = {label!r}",
            "print(f'{label:58} {now / 1024:6.1f} MB  +{(now - last) / 1024:5.1f}')",
            "last = now",
        ]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    print("\nwhat each import adds (VmRSS after it, one fresh interpreter):")
    subprocess.run([sys.executable, "-c", "\n".join(code)], env=env, cwd=tree, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="main", help="revision to compare (git archive)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--version", default="1.36.2", help="control plane for the empty cluster")
    parser.add_argument("--arena-max", type=int, help="also this tree with MALLOC_ARENA_MAX=N")
    parser.add_argument("--modes", default="no cluster,empty cluster")
    parser.add_argument("--parts", action="store_true", help="only the import breakdown")
    args = parser.parse_args()
    if args.parts:
        parts(REPO)
        return

    print(f"load average at start: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    modes = [m.strip() for m in args.modes.split(",")]
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        rev = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", args.baseline],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        targets = [
            Target("this tree", REPO),
            Target(
                f"baseline {args.baseline} ({rev})", baseline_tree(args.baseline, tmp / "baseline")
            ),
            Target("allow-all FastAPI webhook (floor)", None),
        ]
        if args.arena_max:
            targets.append(Target(f"this tree, MALLOC_ARENA_MAX={args.arena_max}", REPO,
                                  {"MALLOC_ARENA_MAX": str(args.arena_max)}))  # fmt: skip
        plane = None
        if "empty cluster" in modes:
            assets = control_plane_assets(args.version)
            plane = stack.enter_context(running_control_plane(tmp / "cp", assets))
            with plane.api_client() as api:
                ensure_namespace(api)
                for i in range(2):
                    _opted_in_namespace(api, f"rss-{i}")
            print(f"control plane {plane.version[0]}.{plane.version[1]}")
        bench = Bench(tmp, plane)
        for mode in modes:
            for t in targets:
                t.samples[mode] = []
            for round_ in range(args.runs):
                for t in targets:
                    t.samples[mode].append(bench.measure(t, mode))
                print(f"  {mode}: round {round_ + 1}/{args.runs}", flush=True)
            report(mode, targets)
    print(f"load average at end: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    parts(REPO)


def _opted_in_namespace(api: object, name: str) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    with contextlib.suppress(client.ApiException):
        core.create_namespace(
            client.V1Namespace.model_validate(
                {"metadata": {"name": name, "labels": {ENABLED_LABEL: "true"}}}
            )
        )


if __name__ == "__main__":
    if not shutil.which("git"):
        sys.exit("git is needed to extract the baseline")
    main()
