"""Which build of the decision core the configpin processes of this run import.

`make test` runs the integration suite on every control plane with the editable install
(pure Python), and once more on the newest one from the unpacked wheel with `webhook/core`
compiled by mypyc (hack/run-tests.py, CONFIGPIN_EXPECT_COMPILED=1): the build the image
ships. The processes the tests start run `python -m webhook` from REPO, as
configpin_proc.running_configpin does; a run meant for one build that ran the other fails
here instead of passing for the wrong build.
"""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys

from harness.configpin import REPO

EXPECT_COMPILED = os.environ.get("CONFIGPIN_EXPECT_COMPILED") == "1"


def test_configpin_processes_run_the_build_under_test() -> None:
    probe = (
        "import importlib, webhook.core.plan as p, webhook.core.refs as r; "
        "print(p.__file__); print(r.__file__)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    files = done.stdout.split()
    assert len(files) == 2
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    assert all(f.endswith(suffixes) is EXPECT_COMPILED for f in files), files
