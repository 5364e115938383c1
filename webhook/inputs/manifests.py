"""Read manifests as kubectl and the API server read them, and write them back.

kubectl turns YAML into JSON with sigs.k8s.io/yaml (go-yaml v2), and the API server decodes
that JSON. PyYAML's own YAML 1.1 rules differ from go-yaml's in ways real manifests show:
`=` is PyYAML's "value" tag (no constructor: an error), `1:20` is a sexagesimal int to PyYAML
and a string to go-yaml, timestamps become dates in PyYAML and stay strings in go-yaml, `y`
and `n` are booleans only to go-yaml. The loader here resolves plain scalars as go-yaml v2
does, and the dumper quotes every string that either reading would take for something else.

Each document keeps where it came from (file, line) and, for YAML, its own text: a document
that nothing changes is written back as it was written (comments and formatting included),
which is also what keeps a 20 MB stream of mostly ConfigMaps fast.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import yaml
from cachetools import LRUCache

# The C (libyaml) parser and emitter where PyYAML was built with them; the Python ones else.
try:
    from yaml import CSafeDumper as _BaseDumper
    from yaml import CSafeLoader as _BaseLoader

    LIBYAML: Final = True
except ImportError:  # pragma: no cover - PyYAML without libyaml
    from yaml import SafeDumper as _BaseDumper  # type: ignore[assignment]
    from yaml import SafeLoader as _BaseLoader  # type: ignore[assignment]

    LIBYAML = False  # type: ignore[misc]

STDIN: Final = "-"

_BOOL_TRUE: Final = ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")
_BOOL_FALSE: Final = ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")
_GO_BOOL: Final = re.compile("^(?:" + "|".join(_BOOL_TRUE + _BOOL_FALSE) + ")$")
_GO_NULL: Final = re.compile(r"^(?:~|null|Null|NULL|)$")
# strconv.ParseInt(s, 0, 64) after go-yaml removed every "_": a leading 0 means octal.
_GO_INT: Final = re.compile(r"^[-+]?(?:0b[01_]+|0o[0-7_]+|0x[0-9a-fA-F_]+|0[0-7_]*|[1-9][0-9_]*)$")
# go-yaml v2's yamlStyleFloat (after removing "_"), and the named floats.
_GO_FLOAT: Final = re.compile(
    r"^(?:[-+]?(?:\.[0-9_]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_DIGITS: Final = list("-+0123456789")
_FLOAT_FIRST: Final = [*_DIGITS, "."]
_MERGE: Final = re.compile(r"^<<$")

_INT_TAG: Final = "tag:yaml.org,2002:int"
_FLOAT_TAG: Final = "tag:yaml.org,2002:float"


class _Loader(_BaseLoader):
    """libyaml's parser and composer with go-yaml v2's scalar resolution (see `_build`)."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        # Called by the C composer for every scalar: the common case (text that starts
        # with a character no special form starts with) answers without a regex.
        if kind is yaml.ScalarNode:
            if implicit[0]:
                if not value:
                    return _NULL_TAG
                candidates = _FIRST.get(value[0])
                if candidates:
                    for tag, regexp in candidates:
                        if regexp.match(value):
                            return tag
            return _STR_TAG
        return _SEQ_TAG if kind is yaml.SequenceNode else _MAP_TAG


_STR_TAG: Final = "tag:yaml.org,2002:str"
_SEQ_TAG: Final = "tag:yaml.org,2002:seq"
_MAP_TAG: Final = "tag:yaml.org,2002:map"
_NULL_TAG: Final = "tag:yaml.org,2002:null"
_BOOL_TAG: Final = "tag:yaml.org,2002:bool"
_MERGE_TAG: Final = "tag:yaml.org,2002:merge"
_FIRST: Final[dict[str, list[tuple[str, re.Pattern[str]]]]] = {}
for _tag, _regexp, _chars in (
    (_BOOL_TAG, _GO_BOOL, "yYnNtTfFoO"),
    (_NULL_TAG, _GO_NULL, "~nN"),
    (_INT_TAG, _GO_INT, "-+0123456789"),
    (_FLOAT_TAG, _GO_FLOAT, "-+0123456789."),
    (_MERGE_TAG, _MERGE, "<"),
):
    for _c in _chars:
        _FIRST.setdefault(_c, []).append((_tag, _regexp))


def _go_int(text: str) -> int:
    s = text.replace("_", "")
    sign = -1 if s.startswith("-") else 1
    s = s.lstrip("+-")
    if s[:2] in ("0b", "0o", "0x"):
        return sign * int(s[2:], {"b": 2, "o": 8, "x": 16}[s[1]])
    if len(s) > 1 and s.startswith("0"):
        return sign * int(s, 8)
    return sign * int(s)


def _int_value(value: str) -> Any:
    try:
        number: int | None = _go_int(value)
    except ValueError:
        number = None
    if number is not None and -(2**63) <= number < 2**64:
        return number
    # Not an int to strconv (`08`, out of range): go-yaml tries a float next.
    return _float_value(value)


def _float_value(text: str) -> Any:
    value = text.replace("_", "")
    lowered = value.lower()
    if lowered.endswith(".inf"):
        return float("-inf") if lowered.startswith("-") else float("inf")
    if lowered == ".nan":
        return float("nan")
    try:
        return float(value)
    except ValueError:
        return text


_SCALARS: Final[dict[str, Any]] = {
    _NULL_TAG: lambda v: None,
    _BOOL_TAG: lambda v: v in _BOOL_TRUE,
    _INT_TAG: _int_value,
    _FLOAT_TAG: _float_value,
    # PyYAML's tags that go-yaml reads as text.
    "tag:yaml.org,2002:timestamp": str,
    "tag:yaml.org,2002:value": str,
}

MAX_NODES: Final = 4_000_000  # per document, aliases expanded (go-yaml refuses alias bombs too)


class _NodeError(Exception):
    def __init__(self, node: Any, message: str) -> None:
        super().__init__(message)
        self.line = node.start_mark.line + 1
        self.message = message


def _merge_sources(node: Any) -> list[Any]:
    if isinstance(node, yaml.MappingNode):
        return [node]
    if isinstance(node, yaml.SequenceNode) and all(
        isinstance(v, yaml.MappingNode) for v in node.value
    ):
        return list(reversed(node.value))  # the first one named wins
    raise _NodeError(node, "a merge key (<<) needs a mapping or a list of mappings")


def _build(node: Any, budget: list[int]) -> Any:
    """The value of a node as go-yaml gives it: every alias a copy of its own (nothing is
    shared), a duplicate key refused, a tag Kubernetes does not read refused."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _NodeError(node, f"more than {MAX_NODES} values once aliases are expanded")
    cls = node.__class__
    tag = node.tag
    if cls is yaml.ScalarNode:
        if tag == _STR_TAG:
            return node.value
        make = _SCALARS.get(tag)
        if make is None:
            raise _NodeError(node, f"the tag {tag} is not one Kubernetes reads")
        return make(node.value)
    if cls is yaml.SequenceNode:
        if tag != _SEQ_TAG:
            raise _NodeError(node, f"the tag {tag} is not one Kubernetes reads")
        return [_build(item, budget) for item in node.value]
    if tag != _MAP_TAG:
        raise _NodeError(node, f"the tag {tag} is not one Kubernetes reads")
    out: dict[Any, Any] = {}
    merged: dict[Any, Any] | None = None
    for key_node, value_node in node.value:
        if key_node.tag == _MERGE_TAG:
            merged = merged if merged is not None else {}
            for source in _merge_sources(value_node):
                merged.update(_build(source, budget))
            continue
        key = _build(key_node, budget)
        if isinstance(key, (dict, list)):
            raise _NodeError(key_node, "a mapping key that is not a scalar (a template?)")
        if key in out:
            raise _NodeError(key_node, f"duplicate key {key!r}")
        out[key] = _build(value_node, budget)
    if merged:
        return {**merged, **out}
    return out


# ---- writing ------------------------------------------------------------------------------


class _Dumper(_BaseDumper):
    """The fallback writer: never writes aliases; quotes what any reader could misread."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


# PyYAML's own resolvers stay (they quote `1:20`, dates, `=`); go-yaml's are added.
_Dumper.add_implicit_resolver(_BOOL_TAG, _GO_BOOL, list("yYnNtTfFoO"))
_Dumper.add_implicit_resolver(_INT_TAG, _GO_INT, _DIGITS)
_Dumper.add_implicit_resolver(_FLOAT_TAG, _GO_FLOAT, _FLOAT_FIRST)


def _represent_str(dumper: Any, value: str) -> Any:
    style = "|" if "\n" in value and not value.startswith(" ") else None
    return dumper.represent_scalar(_STR_TAG, value, style=style)


_Dumper.add_representer(str, _represent_str)

# Words some YAML reader takes for a bool or null (go-yaml v2, PyYAML's YAML 1.1): quoted.
_SPECIAL_WORDS: Final = frozenset((*_BOOL_TRUE, *_BOOL_FALSE, "null", "Null", "NULL", "~"))
# Text that is plain in block context for every reader: starts with a letter or `_`, then no
# indicator that could end it or start a comment; `:` only inside (not last, no space after).
_PLAIN: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_./@+:=-]*")
# Characters a YAML double-quoted scalar must not carry raw (JSON leaves them raw).
_ESCAPE: Final = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]")
_LITERAL_BAD: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ufeff\ud800-\udfff]")
_MAX_KEY: Final = 1000  # longer keys need YAML's explicit `? ` form: left to PyYAML


class _Fallback(Exception):
    pass


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xD800 <= code <= 0xDFFF:
        return "\\ufffd"  # a lone surrogate (only JSON input can hold one): as Go decodes it
    return f"\\u{code:04x}"


_SIMPLE: Final = re.compile(r"[\x20-\x7e]*")


def _quoted(text: str) -> str:
    if _SIMPLE.fullmatch(text):
        if '"' not in text and "\\" not in text:
            return '"' + text + '"'
        if "'" not in text:  # JSON in an annotation reads better single-quoted
            return "'" + text + "'"
    out = json.dumps(text, ensure_ascii=False)
    return _ESCAPE.sub(_escape, out) if _ESCAPE.search(out) else out


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        if _PLAIN.fullmatch(value) and not value.endswith(":") and value not in _SPECIAL_WORDS:
            return value
        return _quoted(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if value in (float("inf"), float("-inf")):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
        return text.replace("e", ".0e") if "." not in text and "e" in text else text
    raise _Fallback


def _literal(text: str, indent: str) -> str | None:
    """A multi-line string as a literal block (`|`), when that says exactly the same."""
    if text[0] in " \n" or _LITERAL_BAD.search(text) or "\r" in text:
        return None
    body = text.rstrip("\n")
    trailing = len(text) - len(body)
    chomp = "-" if trailing == 0 else "" if trailing == 1 else "+"
    lines = body.split("\n")
    if any(line.startswith(" ") for line in lines[:1]):
        return None
    if any(line and not line.strip(" \t") for line in lines):
        return None  # (a line of blanks and tabs alone reads back as an empty one)
    out = "|" + chomp + "\n" + "".join(f"{indent}{line}\n" if line else "\n" for line in lines)
    if trailing > 1:
        out += "\n" * (trailing - 1)
    return out


def _value(value: Any, indent: str, out: list[str]) -> None:
    """`value` after a `key:` or `- ` that is already written (no newline yet)."""
    cls = value.__class__
    if cls is str and "\n" not in value:
        out.append(" " + _scalar(value) + "\n")
    elif cls is int:
        out.append(f" {value}\n")
    elif isinstance(value, dict) and value:
        out.append("\n")
        _mapping(value, indent, out)
    elif isinstance(value, list) and value:
        out.append("\n")
        _sequence(value, indent, out)
    elif isinstance(value, dict):
        out.append(" {}\n")
    elif isinstance(value, list):
        out.append(" []\n")
    elif isinstance(value, str) and "\n" in value:
        block = _literal(value, indent + "  ")
        out.append(" " + (block if block is not None else _quoted(value) + "\n"))
    else:
        out.append(" " + _scalar(value) + "\n")


# Written keys by key: the same few dozen field names make up most of every manifest. (One
# thread: `render` writes its documents one after another.)
_KEYS: LRUCache[str, str] = LRUCache(maxsize=4096)


def _key(key: Any) -> str:
    text = _KEYS.get(key) if key.__class__ is str else None
    if text is None:
        text = _scalar(key)
        if len(text) > _MAX_KEY:
            raise _Fallback
        if key.__class__ is str:
            _KEYS[key] = text
    return text


def _mapping(mapping: dict[Any, Any], indent: str, out: list[str]) -> None:
    for key, value in mapping.items():
        out.append(f"{indent}{_key(key)}:")
        _value(value, indent + "  ", out)


def _sequence(items: list[Any], indent: str, out: list[str]) -> None:
    for item in items:
        if isinstance(item, dict) and item:
            first = True
            for key, value in item.items():
                out.append(f"{indent}- {_key(key)}:" if first else f"{indent}  {_key(key)}:")
                _value(value, indent + "    ", out)
                first = False
        else:
            out.append(f"{indent}-")
            _value(item, indent + "  ", out)


def dump(obj: Any) -> str:
    """One document, `---` first, as block YAML that kubectl (go-yaml) and PyYAML read back as
    `obj`. A small writer of its own: PyYAML's representer costs more than the rest of a
    render; PyYAML (libyaml's emitter) writes what the small one does not (very long keys)."""
    out = ["---\n"]
    try:
        if isinstance(obj, dict) and obj:
            _mapping(obj, "", out)
        elif isinstance(obj, list) and obj:
            _sequence(obj, "", out)
        else:
            raise _Fallback
    except _Fallback:
        text: str = yaml.dump(
            obj,
            Dumper=_Dumper,
            sort_keys=False,
            allow_unicode=True,
            explicit_start=True,
            width=1 << 30,
        )
        return text
    return "".join(out)


class InputError(Exception):
    """Input that cannot be used: `file:line: what`."""

    def __init__(self, file: str, line: int, message: str) -> None:
        super().__init__(f"{file}:{line}: {message}")
        self.file = file
        self.line = line
        self.message = message


@dataclass
class Document:
    """One document of one file. `text` is its own YAML text (None for JSON input)."""

    file: str
    line: int
    obj: Any
    text: str | None = None
    item_lines: list[int] = field(default_factory=list)

    def where(self, index: int | None = None) -> str:
        if index is not None and index < len(self.item_lines):
            return f"{self.file}:{self.item_lines[index]}"
        return f"{self.file}:{self.line}"


def decode(data: bytes, name: str) -> str:
    """Text as kubectl takes it: UTF-8 (a UTF-8 or UTF-16 byte-order mark honoured)."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as e:
            raise InputError(name, 1, f"not valid UTF-16: {e.reason}") from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        byte = data[e.start : e.start + 1].hex()
        raise InputError(
            name, line, f"not UTF-8: byte 0x{byte} at column {column} (save the file as UTF-8)"
        ) from None


def is_json(text: str) -> bool:
    """kubectl's rule (YAMLOrJSONDecoder): a stream whose first character is `{` is JSON."""
    return text.lstrip(" \t\r\n").startswith("{")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_json(text: str, name: str) -> Iterator[Document]:
    """A JSON stream: one or more objects one after another (what `kubectl get -o json` makes)."""
    decoder = json.JSONDecoder(parse_constant=_reject_constant)
    pos = 0
    ws = re.compile(r"[ \t\r\n]*")
    while True:
        match = ws.match(text, pos)
        pos = match.end() if match else pos
        if pos >= len(text):
            return
        line = text.count("\n", 0, pos) + 1
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise InputError(name, e.lineno, f"invalid JSON: {e.msg}") from None
        except (ValueError, RecursionError) as e:
            raise InputError(name, line, f"invalid JSON: {e}") from None
        item_lines: list[int] = []
        if isinstance(obj, dict) and isinstance(obj.get("items"), list):
            item_lines = [line] * len(obj["items"])
        yield Document(name, line, obj, None, item_lines)
        pos = end


def _comment_prefix(gap: str) -> str:
    """Comment lines between a document's `---` and its content (Helm's `# Source: ...`)."""
    lines = gap.split("\n")
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(("---", "%")):
            lines = lines[i + 1 :]
            break
    kept = [line for line in lines if line.lstrip().startswith("#")]
    return "".join(line + "\n" for line in kept)


def _item_lines(root: Any) -> list[int]:
    if not isinstance(root, yaml.MappingNode):
        return []
    for key, value in root.value:
        items = isinstance(key, yaml.ScalarNode) and key.value == "items"
        if items and isinstance(value, yaml.SequenceNode):
            return [item.start_mark.line + 1 for item in value.value]
    return []


def read_yaml(text: str, name: str) -> Iterator[Document]:
    """A YAML stream. Empty documents (only comments, or nothing) are not objects: skipped."""
    loader = _Loader(text)
    previous_end = 0
    try:
        while True:
            try:
                if not loader.check_node():
                    return
                root: Any = loader.get_node()
                obj = _build(root, [MAX_NODES])
            except _NodeError as e:
                raise InputError(name, e.line, e.message) from None
            except RecursionError:
                raise InputError(name, 1, "nested too deeply") from None
            except yaml.MarkedYAMLError as e:
                mark = e.problem_mark or e.context_mark
                line = mark.line + 1 if mark is not None else 1
                what = " ".join(x for x in (e.context, e.problem) if x) or "invalid YAML"
                raise InputError(name, line, f"invalid YAML: {what}") from None
            except yaml.YAMLError as e:
                raise InputError(name, 1, f"invalid YAML: {e}") from None
            except Exception as e:  # PyYAML's own failures on odd input
                raise InputError(name, 1, f"invalid YAML: {type(e).__name__}: {e}") from None
            start, end = root.start_mark, root.end_mark
            line = start.line + 1
            if obj is None:
                previous_end = end.index
                continue
            # The document's own lines, from the start of its first line: the columns of
            # the lines below stay what they were.
            head = text[start.index - start.column : start.index]
            own = head + text[start.index : end.index]
            if not own.endswith("\n"):
                own += "\n"
            if head.lstrip(" ").startswith("---"):  # `--- {...}`, `--- !!map`: its own marker
                own_text = own
            elif head.strip(" "):  # something else before the content: keep only the columns
                own_text = "---\n" + " " * start.column + own[start.column :]
            else:
                own_text = "---\n" + _comment_prefix(text[previous_end : start.index]) + own
            previous_end = end.index
            yield Document(name, line, obj, own_text, _item_lines(root))
    finally:
        loader.dispose()


def read_text(text: str, name: str) -> Iterator[Document]:
    return read_json(text, name) if is_json(text) else read_yaml(text, name)
