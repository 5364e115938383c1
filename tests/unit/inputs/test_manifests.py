"""Reading manifests as kubectl does and writing them back (webhook/inputs/manifests.py), and no
traceback from `configpin render` whatever the input."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from webhook.commands.cli import main
from webhook.inputs.manifests import LIBYAML, InputError, decode, dump, read_text


def _one(text: str) -> Any:
    (doc,) = list(read_text(text, "f.yaml"))
    return doc.obj


def test_the_c_loader_and_emitter_are_used() -> None:
    assert yaml.__with_libyaml__ and LIBYAML


# go-yaml v2 (what kubectl uses) and PyYAML's YAML 1.1 disagree on these plain scalars.
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("=", "="),  # PyYAML: the value tag, no constructor (the kube-prometheus CRD)
        ("1:20", "1:20"),  # PyYAML: sexagesimal 80
        ("2001-12-14", "2001-12-14"),  # PyYAML: a date
        ("2001-12-14T21:59:43Z", "2001-12-14T21:59:43Z"),
        ("y", True),  # go-yaml: a bool
        ("n", False),
        ("on", True),
        ("Off", False),
        ("1e3", 1000.0),  # go-yaml: a float
        ("0x1F", 31),
        ("017", 15),
        ("08", 8.0),  # not octal: go-yaml tries a float
        ("1_000", 1000),
        ("~", None),
        ("", None),
        ("1.10.0", "1.10.0"),
        (".inf", math.inf),
        ("'on'", "on"),
        ('"1:20"', "1:20"),
    ],
)
def test_plain_scalars_read_as_go_yaml_reads_them(text: str, value: Any) -> None:
    assert _one(f"v: {text}\n") == {"v": value}


def test_json_streams_and_lines() -> None:
    docs = list(read_text('{"a": 1}\n\n{"b": [1,\n 2]}\n{"c": null}', "s.json"))
    assert [d.obj for d in docs] == [{"a": 1}, {"b": [1, 2]}, {"c": None}]
    assert [d.line for d in docs] == [1, 3, 5]


def test_yaml_documents_keep_their_text_and_comments() -> None:
    text = "---\n# Source: chart/templates/a.yaml\nkind: A  # why\nx: [1, 2]\n---\n\n---\nkind: B\n"
    a, b = read_text(text, "f.yaml")
    assert a.text == "---\n# Source: chart/templates/a.yaml\nkind: A  # why\nx: [1, 2]\n"
    assert b.text == "---\nkind: B\n" and b.line == 8


@pytest.mark.parametrize(
    "text",
    [
        "--- {kind: A, x: 1,\n  y: 2}\n",
        "--- !!map\nkind: A\n",
        "--- &root\nkind: A\n",
        "---\n  kind: A\n  x: [1,\n 2]\n",
        "kind: A\r\nx: |\r\n  a\r\n",
        "x: |+\n  keep\n\n\n---\nkind: B\n",
    ],
)
def test_a_document_written_back_as_it_was_reads_the_same(text: str) -> None:
    docs = list(read_text(text, "f.yaml"))
    again = list(read_text("".join(d.text or "" for d in docs), "out.yaml"))
    assert [d.obj for d in again] == [d.obj for d in docs]
    assert all(d.text is not None and d.text.startswith("---") for d in docs)


def test_aliases_are_copies_and_merge_keys_merge() -> None:
    obj = _one("a: &x {k: v}\nb: *x\nc:\n  <<: *x\n  k2: w\n")
    assert obj == {"a": {"k": "v"}, "b": {"k": "v"}, "c": {"k": "v", "k2": "w"}}
    assert obj["a"] is not obj["b"]


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("a: 1\nb:\n\t- x\n", 3, "invalid YAML"),
        ("a: 1\na: 2\n", 2, "duplicate key 'a'"),
        ("a: {{ .Values.x }}\n", 1, "not a scalar"),
        ("a: !Ref x\n", 1, "the tag !Ref"),
        ("a: &a [*a]\n", 1, "nested too deeply"),
        ("a: *nowhere\n", 1, "undefined alias"),
        ('{"a": 1,}', 1, "invalid JSON"),
    ],
)
def test_bad_input_is_a_line_and_a_reason(text: str, line: int, what: str) -> None:
    with pytest.raises(InputError) as e:
        list(read_text(text, "f.yaml"))
    assert e.value.line == line and what in e.value.message
    assert str(e.value).startswith(f"f.yaml:{line}: ")


def test_latin1_bytes_name_the_line() -> None:
    with pytest.raises(InputError, match=r"^f.yaml:2: not UTF-8: byte 0xe9"):
        decode(b"a: 1\nb: caf\xe9\n", "f.yaml")
    assert decode(b"\xef\xbb\xbfa: 1\n", "f.yaml") == "a: 1\n"


def test_alias_bombs_are_refused() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    with pytest.raises(InputError, match="aliases are expanded"):
        list(read_text("\n".join(lines) + "\n", "bomb.yaml"))


# ---- the writer: whatever it writes reads back as the same value, for go-yaml and PyYAML ----

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
_words = st.sampled_from(
    ["", "=", "y", "n", "on", "no", "1:20", "08", "1e3", "null", "~", "- x", "a: b", "#c",
     "x #c", " lead", "trail ", "a\nb", "a\n", "a\n\n", "\n", "\ta", "'q'", '"q"', "2001-12-14",
     "\x85", "\u2028", "\ufeff", "{}", "[]", "*x", "&x", "!t", "%p", "@a", "`b", "|", ">", "?",
     "<<", "--- ", "...", "json: {\"a\": 1}"]
)  # fmt: skip
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=True), _text, _words,
)  # fmt: skip
_keys = st.one_of(_text, _words).filter(lambda k: k != "<<")
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_keys, inner, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.dictionaries(_keys, _values, min_size=1, max_size=5))
@example({"": "\t\n"})  # (a literal block's line of a tab alone read back empty)
@example({"k": "a\n \t\nb\n"})
def test_dump_reads_back_the_same(obj: dict[str, Any]) -> None:
    text = dump(obj)
    (doc,) = list(read_text(text, "out.yaml"))
    assert doc.obj == obj
    assert yaml.safe_load(text) == _as_pyyaml_reads(obj)


def _as_pyyaml_reads(value: Any) -> Any:
    return value  # the writer quotes everything PyYAML would read differently


# ---- no input makes render print a traceback ----

_fragments = st.sampled_from(
    ["apiVersion: v1\n", "kind: ConfigMap\n", "kind: Deployment\n", "kind: List\n", "items:\n",
     "- ", "metadata: x\n", "metadata:\n  name: a\n", "  namespace: 3\n", "data:\n", "  k: null\n",
     "  k: [1]\n", "binaryData: {k: '%%'}\n", "spec:\n  template:\n    spec:\n      containers:\n",
     "      - envFrom: [{configMapRef: {name: a}}]\n", "        volumes: 7\n", "---\n", "\t",
     "{{ x }}",
     "&a ", "*a", "<<: *a\n", "!!binary x\n", "= \n", '{"kind": "Pod"', "}\n", "\xe9", "\x00",
     "annotations: {a: 1}\n", "labels: []\n", "stringData: {k: v}\n", "type: 5\n", "\n"]
)  # fmt: skip


@settings(max_examples=80, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(_fragments, max_size=25), st.sampled_from(["checksum", "snapshot"]))
def test_no_input_makes_render_raise(
    tmp_path_factory: pytest.TempPathFactory, parts: list[str], mode: str
) -> None:
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "in.yaml").write_bytes("".join(parts).encode("utf-8", "surrogateescape"))
    (folder / "key").write_text("fuzz-digest-key-0123456789")
    for extra in ([], ["--skip-invalid"]):
        status = main(
            ["render", "-f", str(folder / "in.yaml"), "--digest-key-file", str(folder / "key"),
             "--mode", mode, *extra]
        )  # fmt: skip
        assert status in (0, 1, 2)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.binary(max_size=200))
def test_no_bytes_make_render_raise(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    folder = tmp_path_factory.mktemp("bytes")
    (folder / "in.yaml").write_bytes(data)
    (folder / "key").write_text("fuzz-digest-key-0123456789")
    status = main(
        ["render", "-f", str(folder / "in.yaml"), "--digest-key-file", str(folder / "key")]
    )
    assert status in (0, 1, 2)


def test_render_of_missing_files_and_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "key"
    key.write_text("a-digest-key-0123456789")
    assert main(["render", "-f", str(tmp_path / "nope.yaml"), "--digest-key-file", str(key)]) == 2
    assert "nope.yaml" in capsys.readouterr().err
