"""Build configpin, with its decision core (`webhook/core`) compiled by mypyc where it can be.

The metadata is all in pyproject.toml; this file only adds the compiled modules. What runs is
the same code either way: `webhook/core` is plain, `mypy --strict` Python that mypyc turns into
C extensions, about a third fewer instructions per admission (bench/README.md, `hotpath.py`).

`CONFIGPIN_COMPILE` decides:

- `auto` (the default): a wheel (`pip install .`, `pip wheel .`) is compiled when mypyc and a
  C compiler with Python's headers are there. If compiling fails, the wheel is the pure-Python
  package, and the build says so: configpin installs wherever Python runs.
- `1`: compiled, or the build fails (the container image: it never ships the slow path by
  accident).
- `0`: pure Python.

An editable install (`pip install -e .`, what `make` sets up) is never compiled, whatever the
setting: an extension module next to its `.py` is what Python imports, so a compiled module
would keep running after its source was edited. Nothing is ever built into the source tree.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
CORE = sorted(
    str(p.relative_to(HERE))
    for p in (HERE / "webhook" / "core").glob("*.py")
    if p.stem != "__init__"
)
# The commands that put modules into a wheel or an installation. Metadata queries (egg_info,
# dist_info: what pip asks first) and editable installs (editable_wheel, develop) compile nothing.
_BUILDS = {"bdist_wheel", "build", "build_ext", "install"}
_EDITABLE = {"editable_wheel", "develop"}


def _say(message: str) -> None:
    print(f"configpin build: {message}", file=sys.stderr, flush=True)


class _BuildCompiled(build_ext):
    """build_ext that, unless compiling was demanded, falls back to the pure-Python package
    when the compiled modules cannot be built (no compiler, no Python headers): every one of
    them or none, since they share one runtime library."""

    required = False

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:
            if self.required:
                raise
            for output in self.get_outputs():
                Path(output).unlink(missing_ok=True)
            self.extensions = []
            _say(f"compiling webhook/core failed ({e}): building the pure-Python package")


def _ext_modules() -> list[object]:
    mode = os.environ.get("CONFIGPIN_COMPILE", "auto").strip().lower()
    if mode not in ("auto", "1", "0"):
        raise SystemExit(f"CONFIGPIN_COMPILE={mode!r}: expected auto, 1 or 0")
    commands = set(sys.argv[1:])
    if mode == "0" or commands & _EDITABLE or not commands & _BUILDS:
        return []
    _BuildCompiled.required = mode == "1"
    try:
        from mypyc.build import mypycify  # noqa: PLC0415 (a build requirement, maybe absent)
    except ImportError as e:
        if mode == "1":
            raise SystemExit(f"CONFIGPIN_COMPILE=1 but mypyc cannot be imported: {e}") from e
        _say(f"mypyc is not installed ({e}): building the pure-Python package")
        return []
    _say(f"compiling {len(CORE)} modules of webhook/core with mypyc")
    # mypyc type-checks webhook/core, which imports only itself and the standard library,
    # strictly and with no configuration file (`--config-file ""`): the project's [tool.mypy]
    # loads pydantic's plugin, which is no build requirement (the image's build venv has
    # setuptools and mypy only).
    return list(
        mypycify(
            ["--config-file", "", "--strict", *CORE],
            opt_level="3",
            debug_level="0",
            group_name="webhook_core",
        )
    )


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": _BuildCompiled})
