"""What the server process imports: a package imported stays in memory for the process's life
(bench/README.md, `serve_rss.py`), so the serving path leaves out what it does not run."""

from __future__ import annotations

import json
import subprocess
import sys

# Each is imported where it is used: the official client for exec plugins, auth providers
# and proxies (`webhook.kube.client`) and by `status`; cryptography to make a certificate;
# YAML to read a kubeconfig or manifest files; JSON patch by `render`.
NOT_SERVED = ("kubernetes", "cryptography", "yaml", "jsonpatch", "webhook.commands.render")


def test_serving_imports_leave_out_what_serving_does_not_run() -> None:
    code = (
        "import json, sys\n"
        "from webhook.commands import cli, serve\n"
        "from webhook.kube import client, raw, selfcerts\n"
        "from webhook.server import tls\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {NOT_SERVED!r}"
        f" or m in {NOT_SERVED!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == []
