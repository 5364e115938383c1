"""`configpin render` on a large stream: wall time of the command, this tree against a baseline.

The stream (about 20 MB) holds `--deployments` Deployments (2,400), each with its own ConfigMap
(a config file of about 7 KiB and a few plain keys) consumed through `envFrom`, a `valueFrom`
key and a volume with `items`, the way an application's manifests look. The command is run as
a user runs it (`python -m webhook render -f FILE --digest-key-file KEY > /dev/null`), in a
subprocess, `--runs` times; the medians are printed with their ratio. The baseline is another
revision of the repository (`--baseline`, default: the commit this branch started from),
extracted with `git archive` into a temporary folder and run the same way.

    .venv/bin/python -m bench.render [--runs 5] [--baseline REV] [--no-baseline]

Writes only into a temporary folder; no cluster, no network.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.common import REPO, baseline_tree

KEY = "bench-render-digest-key-0123456789abcdef"


def _config_file(i: int) -> str:
    lines = [f"# service {i}: generated configuration", "server:"]
    for j in range(132):
        lines.append(f"  option_{j:03d}: value-{i}-{j}-" + "x" * 24)
    return "\n".join(lines) + "\n"


def stream(deployments: int) -> str:
    """ConfigMap, Deployment, ConfigMap, Deployment, ... as one YAML stream."""
    docs = []
    for i in range(deployments):
        name = f"svc-{i:04d}"
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"{name}-config", "labels": {"app": name}},
                "data": {
                    "config.yaml": _config_file(i),
                    "LOG_LEVEL": "info",
                    "FEATURE_FLAGS": "a,b,c",
                    "PORT": "8080",
                },
            }
        )
        docs.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "labels": {"app": name}},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {
                            "containers": [
                                {
                                    "name": "app",
                                    "image": f"registry.example/{name}:1.0.{i}",
                                    "ports": [{"containerPort": 8080, "name": "http"}],
                                    "envFrom": [{"configMapRef": {"name": f"{name}-config"}}],
                                    "env": [
                                        {
                                            "name": "LEVEL",
                                            "valueFrom": {
                                                "configMapKeyRef": {
                                                    "name": f"{name}-config",
                                                    "key": "LOG_LEVEL",
                                                }
                                            },
                                        }
                                    ],
                                    "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}],
                                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                                }
                            ],
                            "volumes": [
                                {
                                    "name": "config",
                                    "configMap": {
                                        "name": f"{name}-config",
                                        "items": [{"key": "config.yaml", "path": "config.yaml"}],
                                    },
                                }
                            ],
                        },
                    },
                },
            }
        )
    return yaml.safe_dump_all(docs, sort_keys=False, width=1 << 30)


def time_render(tree: Path, manifest: Path, key: Path) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one render."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "webhook", "render", "-f", str(manifest)]
    cmd += ["--digest-key-file", str(key)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"render exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deployments", type=int, default=2400)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", help="git revision (default: merge-base with main)")
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args()

    import webhook.inputs.manifests

    print(f"PyYAML {yaml.__version__}, libyaml loader/emitter: {webhook.inputs.manifests.LIBYAML}")
    with tempfile.TemporaryDirectory(prefix="configpin-bench-render-") as tmp:
        folder = Path(tmp)
        manifest = folder / "stream.yaml"
        manifest.write_text(stream(args.deployments))
        key = folder / "digest.key"
        key.write_text(KEY)
        size = manifest.stat().st_size
        n = args.deployments
        print(f"stream: {n} Deployments + {n} ConfigMaps, {size / 1e6:.1f} MB")

        trees = {"this tree": REPO}
        if not args.no_baseline:
            rev = (
                args.baseline
                or subprocess.run(
                    ["git", "merge-base", "HEAD", "main"],
                    cwd=REPO,
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout.strip()
            )
            trees[f"baseline {rev[:10]}"] = baseline_tree(rev, folder / "baseline")
        medians: dict[str, tuple[float, float]] = {}
        for label, tree in trees.items():
            runs = [time_render(tree, manifest, key) for _ in range(args.runs)]
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            medians[label] = (wall, cpu)
            each = " ".join(f"{r[0]:.2f}" for r in runs)
            print(f"{label:>22}: median {wall:.2f} s wall, {cpu:.2f} s CPU  (wall: {each})")
        if len(medians) == 2:
            (ours, ours_cpu), (base, base_cpu) = medians.values()
            print(
                f"{'ratio':>22}: {ours / base:.3f} of the baseline's wall time "
                f"({base / ours:.1f}x faster), {ours_cpu / base_cpu:.3f} of its CPU time"
            )
        wall, cpu = medians["this tree"]
        # The machine may be shared: CPU time says what the render costs when it has a core.
        print(
            f"{'target':>22}: under 3 s: wall {'yes' if wall < 3 else 'NO'}, "
            f"CPU {'yes' if cpu < 3 else 'NO'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
