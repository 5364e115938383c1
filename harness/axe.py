"""axe-core (Deque's accessibility engine, from npm) for the dashboard's browser tests: a pinned
version, fetched from the npm registry with its integrity hash checked, into
~/.cache/configpin/axe-core/VERSION/axe.min.js (once; a copy there is checked again).

    python -m harness.axe            # prints the path of axe.min.js, fetching it if missing

The browser tests (tests/browser/accessible.py) call `ensure()`, so `make test` and `make
browser` fetch it themselves, and evaluate the file in the page through Playwright (the
dashboard's Content-Security-Policy refuses an inline <script>, as `add_script_tag` adds; a
script evaluated through DevTools is not refused). No node and no npm client are needed.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from typing import Final

VERSION: Final = "4.10.3"
TARBALL: Final = f"https://registry.npmjs.org/axe-core/-/axe-core-{VERSION}.tgz"
# the registry's dist.integrity of that version (`npm view axe-core@4.10.3 dist.integrity`)
INTEGRITY: Final = (
    "sha512-Xm7bpRXnDSX2YE2YFfBk2FnF0ep6tmG7xPh8iHee8MIcrgq762Nkce856dYtJYLkuIoYZvGfTs/"
    "PbZhideTcEg=="
)
MEMBER: Final = "package/axe.min.js"


def _log(line: str) -> None:
    print(f"harness.axe: {line}", file=sys.stderr, flush=True)


def _folder() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "configpin" / "axe-core" / VERSION


def _check(tarball: bytes) -> None:
    algorithm, _, want = INTEGRITY.partition("-")
    got = base64.b64encode(hashlib.new(algorithm, tarball).digest()).decode()
    if got != want:
        raise RuntimeError(f"{TARBALL}: integrity {algorithm}-{got}, not {INTEGRITY}")


def ensure() -> Path:
    """axe.min.js of the pinned version, fetched and checked when it is missing."""
    folder = _folder()
    script = folder / "axe.min.js"
    kept = folder / "axe-core.tgz"
    if script.exists() and kept.exists():
        _check(kept.read_bytes())
        return script
    _log(f"fetching axe-core {VERSION} from the npm registry")
    with urllib.request.urlopen(TARBALL, timeout=60) as answer:
        tarball = answer.read()
    _check(tarball)
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        member = tar.extractfile(MEMBER)
        if member is None:
            raise RuntimeError(f"{TARBALL} holds no {MEMBER}")
        body = member.read()
    folder.mkdir(parents=True, exist_ok=True)
    for path, data in ((kept, tarball), (script, body)):
        with tempfile.NamedTemporaryFile(dir=folder, delete=False) as tmp:
            tmp.write(data)
        os.replace(tmp.name, path)  # (another test process may fetch it at once)
    return script


if __name__ == "__main__":
    print(ensure())
