"""The server-held HMAC key that every digest is made with.

The key is the bytes of its text form (64 hex characters when configpin makes it), so one key
file, one Secret value and one environment give the same digests everywhere.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Final

MIN_KEY_BYTES: Final = 16
KEY_FILE_NAME: Final = "digest.key"


class BadDigestKey(ValueError):
    pass


def new_key_text() -> bytes:
    return secrets.token_hex(32).encode()


def parse_key(raw: bytes, where: str) -> bytes:
    key = raw.strip()
    if len(key) < MIN_KEY_BYTES:
        raise BadDigestKey(f"the digest key in {where} is shorter than {MIN_KEY_BYTES} bytes")
    return key


def load_key_file(path: Path) -> bytes:
    try:
        return parse_key(path.read_bytes(), str(path))
    except OSError as e:
        raise BadDigestKey(f"cannot read the digest key file {path}: {e.strerror}") from e


def ensure_key_file(directory: Path) -> Path:
    """The dev key next to the dev certificates: made once (mode 0600), then reused."""
    path = directory / KEY_FILE_NAME
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(new_key_text() + b"\n")
        try:
            os.link(tmp, path)  # two starters at once: the first one's key wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path
