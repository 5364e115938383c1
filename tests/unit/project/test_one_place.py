"""One fact in one place (issue 38): the source kinds in one table (webhook/core/model.py,
SOURCE_FACTS), configpin's signed records signed and opened in one module
(webhook/core/signed.py), and a content's short form cut in one function
(webhook.core.digest.content_id). A module that writes one of them again fails here."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from webhook.core.model import SOURCE_FACTS, SourceKind, source_kind, typed_source_kind

WEBHOOK = Path(__file__).resolve().parents[3] / "webhook"
REGISTRY = "core/model.py"
# configpin's own Secrets (its serving certificate, its digest key) are Secrets, not sources
OWN_SECRETS = {"kube/selfcerts.py", "kube/digestkey.py"}
OWN_SECRET_WORDS = {"Secret", "secrets", "Opaque"}


def _facts() -> set[str]:
    """Every word of the table a module could write again: each kind's names, API kind,
    resource, pod-spec fields, content fields and types ("data" and "name" are every
    object's, and the value of the enum is the enum's)."""
    words: set[str] = set()
    for facts in SOURCE_FACTS.values():
        words |= {facts.api_kind, facts.resource, *facts.names, facts.volume, facts.volume_name}
        words |= {facts.key_ref, facts.env_from, *(f.name for f in facts.content)}
        words |= {*facts.unwatched_types, facts.default_type or ""}
    return words - {"", "data", "name"}


def _strings(tree: ast.AST) -> Iterator[ast.Constant]:
    """The string literals of a module, its docstrings aside."""
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            docs.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node


def _modules() -> Iterator[tuple[str, ast.AST]]:
    for source in sorted(WEBHOOK.rglob("*.py")):
        yield source.relative_to(WEBHOOK).as_posix(), ast.parse(source.read_text(), str(source))


def test_the_source_kinds_are_one_table() -> None:
    """No module but the registry writes a source kind's name, resource or fields: it reads
    SOURCE_FACTS (kubectl's `cm`, `configMapKeyRef`, `secrets`, `binaryData`, ...)."""
    words = _facts()
    found = []
    for name, tree in _modules():
        if name in (REGISTRY, "core/constants.py"):
            continue
        for node in _strings(tree):
            if node.value not in words:
                continue
            if name in OWN_SECRETS and node.value in OWN_SECRET_WORDS:
                continue
            found.append(f"webhook/{name}:{node.lineno}: {node.value!r}")
    assert found == [], "a source kind's fact written outside webhook/core/model.py"


def test_the_registry_answers_what_people_and_the_api_name() -> None:
    for kind in SourceKind:
        assert source_kind(kind.api_kind) is kind
        for name in kind.facts.names:
            assert typed_source_kind(name) is kind
            assert typed_source_kind(name.upper()) is kind
    assert typed_source_kind("cm") is SourceKind.CONFIGMAP
    assert source_kind("Pod") is None and typed_source_kind("pod") is None


def test_signed_records_are_signed_and_opened_in_one_module() -> None:
    """An HMAC is taken (and compared) in webhook/core/signed.py, configpin's signed records,
    and webhook/core/digest.py, digests and a copy's signature, only."""
    users = {
        name
        for name, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "hmac"
    }
    assert users == {"core/signed.py", "core/digest.py"}


def test_a_contents_short_form_is_cut_in_one_function() -> None:
    """`x[:20]` (a content's short form, digest.content_id) nowhere else."""
    found = []
    for name, tree in _modules():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice)):
                continue
            upper = node.slice.upper
            if node.slice.lower is None and isinstance(upper, ast.Constant) and upper.value == 20:
                found.append(f"webhook/{name}:{node.lineno}")
    assert found == []
