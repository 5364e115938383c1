"""`kubectl configpin dashboard` as a user starts it: the plugin on PATH, a kubeconfig, a
namespace; the URL it prints; stopped with Ctrl-C (SIGINT)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Dashboard:
    url: str  # "http://localhost:PORT/"
    port: int
    proc: subprocess.Popen[str]
    output: list[str]

    def log(self) -> str:
        return "".join(self.output)


@contextlib.contextmanager
def running_dashboard(
    kubeconfig: Path, namespace: str, *args: str, timeout: float = 60.0
) -> Iterator[Dashboard]:
    """The dashboard of `namespace` with `kubeconfig`'s user, on a free port."""
    plugin = str(Path(sys.executable).parent / "kubectl-configpin")
    argv: Sequence[str] = [plugin, "dashboard", "--port", "0", "-n", namespace, *args]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    output: list[str] = []
    found = threading.Event()
    url: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            if not url and line.startswith("configpin dashboard: http://"):
                url.append(line.split()[2])
                found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while not found.wait(0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the dashboard did not start: {''.join(output)}")
    port = int(url[0].rstrip("/").rsplit(":", 1)[1])
    try:
        yield Dashboard(url[0], port, proc, output)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
        if proc.stdout is not None:
            proc.stdout.close()
