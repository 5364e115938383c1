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
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

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
    """libyaml's parser, go-yaml v2's scalar resolution, the document's root node kept."""

    yaml_implicit_resolvers: dict[Any, Any] = {}  # PyYAML's class registry

    root: Any = None

    def construct_document(self, node: Any) -> Any:
        self.root = node
        return super().construct_document(node)


_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", _GO_BOOL, list("yYnNtTfFoO"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:null", _GO_NULL, ["~", "n", "N", ""])
_Loader.add_implicit_resolver(_INT_TAG, _GO_INT, _DIGITS)
_Loader.add_implicit_resolver(_FLOAT_TAG, _GO_FLOAT, _FLOAT_FIRST)
_Loader.add_implicit_resolver("tag:yaml.org,2002:merge", _MERGE, ["<"])


def _go_int(text: str) -> int:
    s = text.replace("_", "")
    sign = -1 if s.startswith("-") else 1
    s = s.lstrip("+-")
    if s[:2] in ("0b", "0o", "0x"):
        return sign * int(s[2:], {"b": 2, "o": 8, "x": 16}[s[1]])
    if len(s) > 1 and s.startswith("0"):
        return sign * int(s, 8)
    return sign * int(s)


def _construct_int(loader: Any, node: Any) -> Any:
    value = loader.construct_scalar(node)
    try:
        number = _go_int(value)
    except ValueError:
        number = None
    if number is not None and -(2**63) <= number < 2**64:
        return number
    # Not an int to strconv (`08`, out of range): go-yaml tries a float next.
    return _construct_float(loader, node)


def _construct_float(loader: Any, node: Any) -> Any:
    value = str(loader.construct_scalar(node)).replace("_", "")
    lowered = value.lower()
    if lowered.endswith(".inf"):
        return float("-inf") if lowered.startswith("-") else float("inf")
    if lowered == ".nan":
        return float("nan")
    try:
        return float(value)
    except ValueError:
        return value


def _construct_bool(loader: Any, node: Any) -> bool:
    return str(loader.construct_scalar(node)) in _BOOL_TRUE


def _construct_plain_str(loader: Any, node: Any) -> Any:
    """Tags PyYAML knows and go-yaml reads as text (`!!timestamp`, `!!value`)."""
    return loader.construct_scalar(node)


_Loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
_Loader.add_constructor(_INT_TAG, _construct_int)
_Loader.add_constructor(_FLOAT_TAG, _construct_float)
_Loader.add_constructor("tag:yaml.org,2002:timestamp", _construct_plain_str)
_Loader.add_constructor("tag:yaml.org,2002:value", _construct_plain_str)


class _Dumper(_BaseDumper):
    """Never writes aliases; quotes a string that PyYAML or go-yaml would read as non-text."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


# PyYAML's own resolvers stay (they quote `1:20`, dates, `=`); go-yaml's are added.
_Dumper.add_implicit_resolver("tag:yaml.org,2002:bool", _GO_BOOL, list("yYnNtTfFoO"))
_Dumper.add_implicit_resolver(_INT_TAG, _GO_INT, _DIGITS)
_Dumper.add_implicit_resolver(_FLOAT_TAG, _GO_FLOAT, _FLOAT_FIRST)


def _represent_str(dumper: Any, value: str) -> Any:
    # Multi-line text (config files, dashboards) as a literal block: readable in a review.
    style = "|" if "\n" in value and not value.startswith(" ") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)

_WIDTH: Final = 1 << 30  # never fold long lines: annotations carry long JSON


def dump(obj: Any) -> str:
    """One document, `---` first, as YAML that kubectl reads back as `obj`."""
    text: str = yaml.dump(
        obj,
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        explicit_start=True,
        width=_WIDTH,
    )
    return text


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


# An alias (`*name`) where YAML allows one: only then can two places share one node.
_ALIAS: Final = re.compile(r"(?:^|[\s\[{,:-])\*[^\s,\[\]{}]")


def unshare(value: Any, _open: frozenset[int] = frozenset()) -> Any:
    """A copy in which no two places are one object (YAML aliases are separate copies)."""
    if isinstance(value, dict):
        if id(value) in _open:
            raise ValueError("a recursive alias (an anchor used inside itself)")
        inner = _open | {id(value)}
        return {k: unshare(v, inner) for k, v in value.items()}
    if isinstance(value, list):
        if id(value) in _open:
            raise ValueError("a recursive alias (an anchor used inside itself)")
        inner = _open | {id(value)}
        return [unshare(v, inner) for v in value]
    return value


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
                if not loader.check_data():  # type: ignore[no-untyped-call]
                    return
                obj = loader.get_data()
            except yaml.MarkedYAMLError as e:
                mark = e.problem_mark or e.context_mark
                line = mark.line + 1 if mark is not None else 1
                what = " ".join(x for x in (e.context, e.problem) if x) or "invalid YAML"
                raise InputError(name, line, f"invalid YAML: {what}") from None
            except yaml.YAMLError as e:
                raise InputError(name, 1, f"invalid YAML: {e}") from None
            except (Exception, RecursionError) as e:  # PyYAML's own failures on odd input
                raise InputError(name, 1, f"invalid YAML: {type(e).__name__}: {e}") from None
            root = loader.root
            start, end = root.start_mark, root.end_mark
            line = start.line + 1
            if obj is None:
                previous_end = end.index
                continue
            own = text[start.index : end.index]
            if _ALIAS.search(own):
                try:
                    obj = unshare(obj)
                except (ValueError, RecursionError) as e:
                    raise InputError(name, line, str(e)) from None
            prefix = _comment_prefix(text[previous_end : start.index])
            if start.column and text[start.index - start.column : start.index].strip(" "):
                # content on the `---` line: keep the column so the lines below still line up
                own = " " * start.column + own
            elif start.column:
                own = text[start.index - start.column : start.index] + own
            if not own.endswith("\n"):
                own += "\n"
            previous_end = end.index
            yield Document(name, line, obj, "---\n" + prefix + own, _item_lines(root))
    finally:
        loader.dispose()


def read_text(text: str, name: str) -> Iterator[Document]:
    return read_json(text, name) if is_json(text) else read_yaml(text, name)
