"""The GitOps tools' health checks as they run them, for the tests that evaluate configpin's:
Argo CD's Lua health scripts (`resource.customizations.health.*`, charts/configpin/files/argocd)
and Flux's `healthCheckExprs` (CEL), both given an object as the API server returns it.

- `argocd_health(lua, obj)`: the script run on Lua 5.1 (gopher-lua, Argo CD's engine, is a
  Lua 5.1), `obj` its global as Argo CD makes it from the object's JSON (objects and arrays
  as tables, arrays from 1, numbers as Lua numbers, nulls left out); its `hs` read back as
  Argo CD reads it. `open_libs=False` is Argo CD's sandbox for a custom check without
  `resource.customizations.useOpenLibs.<group>_<kind>`: only the base, table, package and os
  libraries, no string library (nor string methods).
- `flux_health(exprs, obj)`: kustomize-controller's CEL status reader (fluxcd/pkg
  runtime/cel): the entry for the object's group and kind, `inProgress` while
  status.observedGeneration (an integer) differs from metadata.generation, then the first of
  `inProgress`, `failed`, `current` that is true, else `inProgress`; None when no entry is
  for that kind. The expressions see the object's top-level fields as variables.

An expression or a script that errors raises (`HealthError`): Argo CD then says Unknown, and
Flux waits until its timeout. `argocd_check(kind)` is the chart's script for a kind, and
`documented_flux_exprs(page)` the `healthCheckExprs` a page of docs/ gives: what both test
suites evaluate, so that what is tested is what an operator installs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import celpy
import yaml
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

try:  # lupa >= 2 builds one module per Lua version; Argo CD's Lua is a 5.1
    from lupa import lua51 as _lua
except ImportError:  # pragma: no cover (a lupa built for one Lua only)
    import lupa as _lua

REPO = Path(__file__).resolve().parents[1]
ARGOCD_CHECKS = REPO / "charts" / "configpin" / "files" / "argocd"
KINDS = ("Deployment", "StatefulSet", "DaemonSet")  # the kinds configpin ships checks for

# What Argo CD accepts as a health status (argo-cd util/lua: isValidHealthStatusCode).
STATUSES = ("Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown")

# gopher-lua's libraries a custom check has without useOpenLibs (argo-cd util/lua/lua.go):
# package, base, table and a safe os. Everything else is taken out of the global table.
_SANDBOX = ("string", "io", "debug", "math", "coroutine")


class HealthError(Exception):
    """A health script or expression that errors, or answers what its tool does not accept."""


def lua_runtime(*, open_libs: bool = True) -> Any:
    """A Lua 5.1 runtime; `open_libs=False`: with only what Argo CD opens by default."""
    runtime = _lua.LuaRuntime(unpack_returned_tuples=True)
    version = runtime.eval("_VERSION")
    assert version == "Lua 5.1", f"Argo CD runs Lua 5.1 (gopher-lua), this is {version}"
    if not open_libs:
        runtime.execute(
            "getmetatable('').__index = nil\n"
            + "".join(f"{name} = nil\npackage.loaded.{name} = nil\n" for name in _SANDBOX)
        )
    return runtime


def to_lua(runtime: Any, value: Any) -> Any:
    """`value` (JSON-shaped) as Argo CD hands it to Lua: tables for objects and arrays (arrays
    1-indexed), nulls left out."""
    if isinstance(value, Mapping):
        table = runtime.table()
        for key, item in value.items():
            if item is not None:
                table[str(key)] = to_lua(runtime, item)
        return table
    if isinstance(value, list | tuple):
        table = runtime.table()
        for i, item in enumerate(value, start=1):
            if item is not None:
                table[i] = to_lua(runtime, item)
        return table
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return float(value)  # (every Lua 5.1 number is a double, as every gopher-lua LNumber)
    return None


def argocd_health(
    lua_text: str, obj: Mapping[str, Any], *, open_libs: bool = True
) -> tuple[str, str]:
    """(status, message) of health script `lua_text` on `obj`, as Argo CD reads its `hs`."""
    runtime = lua_runtime(open_libs=open_libs)
    runtime.globals().obj = to_lua(runtime, obj)
    try:
        result = runtime.execute(lua_text)
    except _lua.LuaError as e:
        raise HealthError(f"the health script errors: {e}") from e
    if _lua.lua_type(result) != "table":
        raise HealthError(f"expect table output from Lua script, not {_lua.lua_type(result)}")
    status, message = result["status"], result["message"]
    if status not in STATUSES:
        return "Unknown", "Lua returned an invalid health status"
    return str(status), "" if message is None else str(message)


def _group_kind(api_version: str, kind: str) -> tuple[str, str]:
    group = api_version.rpartition("/")[0] if "/" in api_version else ""
    return group, kind


def _entry(exprs: Sequence[Mapping[str, str]], obj: Mapping[str, Any]) -> Mapping[str, str] | None:
    """The entry for the object's group and kind (one with a kind before one for its group)."""
    want = _group_kind(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
    for_group = None
    for entry in exprs:
        group, kind = _group_kind(entry["apiVersion"], entry.get("kind", ""))
        if (group, kind) == want:
            return entry
        if group == want[0] and not kind and for_group is None:
            for_group = entry
    return for_group


# `has(NAME.field)` of a top-level NAME the object lacks: cel-go (Flux) errors ("no such
# attribute"), cel-python says false; the harness errors as Flux does.
_HAS_TOP = re.compile(r"\bhas\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\.")
_BOUND = re.compile(r"\b(?:all|exists|exists_one|filter|map)\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,")


def cel_value(expr: str, obj: Mapping[str, Any]) -> Any:
    """The value of CEL expression `expr` over the object's top-level fields."""
    bound = set(_BOUND.findall(expr))  # (a macro's own variable)
    missing = sorted({n for n in _HAS_TOP.findall(expr) if n not in obj and n not in bound})
    if missing:
        raise HealthError(f"CEL expression {expr!r}: no such attribute: {', '.join(missing)}")
    env = celpy.Environment()
    try:
        program = env.program(env.compile(expr))
        activation = {str(k): json_to_cel(v) for k, v in obj.items()}
        value = program.evaluate(activation)
    except (CELParseError, CELEvalError) as e:
        raise HealthError(f"CEL expression {expr!r}: {e}") from e
    if isinstance(value, CELEvalError):
        raise HealthError(f"CEL expression {expr!r}: {value}")
    return value


def flux_health(exprs: Sequence[Mapping[str, str]], obj: Mapping[str, Any]) -> str | None:
    """What kustomize-controller says of `obj` with `healthCheckExprs` `exprs`: "current",
    "inProgress" or "failed"; None when none of them is for its kind."""
    entry = _entry(exprs, obj)
    if entry is None:
        return None
    if not entry.get("current"):
        raise HealthError("expression Current not specified")
    observed = (obj.get("status") or {}).get("observedGeneration")
    generation = (obj.get("metadata") or {}).get("generation")
    if isinstance(observed, int) and isinstance(generation, int) and observed != generation:
        return "inProgress"
    for key in ("inProgress", "failed", "current"):
        expr = entry.get(key)
        if not expr:
            continue
        value = cel_value(expr, obj)
        if not isinstance(value, celtypes.BoolType):
            raise HealthError(f"failed to evaluate CEL expression as boolean: {expr!r}")
        if value:
            return key
    return "inProgress"


def argocd_check(kind: str) -> str:
    """The chart's Argo CD health script for apps/v1 `kind`."""
    return (ARGOCD_CHECKS / f"health-apps_{kind}.lua").read_text()


def fenced(page: str, lang: str, marker: str) -> str:
    """The one fenced `lang` block of docs/`page` that holds `marker`, unindented."""
    text = (REPO / "docs" / page).read_text()
    blocks = re.findall(rf"^( *)```{lang}\n(.*?)^\1```$", text, re.S | re.M)
    found = [
        "\n".join(line[len(indent) :] for line in body.splitlines())
        for indent, body in blocks
        if marker in body
    ]
    assert len(found) == 1, f"docs/{page}: {len(found)} {lang} blocks with {marker!r}"
    return found[0]


def documented_flux_exprs(page: str = "gitops.md") -> list[dict[str, str]]:
    """The `healthCheckExprs` of the Kustomization docs/`page` shows."""
    spec = yaml.safe_load(fenced(page, "yaml", "healthCheckExprs:"))["spec"]
    exprs: list[dict[str, str]] = spec["healthCheckExprs"]
    return exprs
