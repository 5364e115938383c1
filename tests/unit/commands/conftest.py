"""Fixtures of the commands' unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

KEY_TEXT = "3f1c0b6a9e2d4c5b8a7f6e5d4c3b2a19\n"  # read as the stripped bytes, like the server


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    """A digest key file, for `configpin render --digest-key-file`."""
    path = tmp_path / "digest.key"
    path.write_text(KEY_TEXT)
    return path
