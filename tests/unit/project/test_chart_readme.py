"""charts/configpin/README.md is what hack/chart-readme.py writes from Chart.yaml and
values.yaml: a value added, renamed or described anew without running it fails here."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import yaml

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "hack" / "chart-readme.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_readme", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def _leaves(tree: dict[str, object], prefix: str = "") -> set[str]:
    found = set()
    for key, value in tree.items():
        path = f"{prefix}{key}"
        found.add(path)
        if isinstance(value, dict) and value:
            found |= _leaves(value, f"{path}.")
    return found


def test_the_chart_readme_is_current() -> None:
    readme = _script()
    assert (REPO / "charts" / "configpin" / "README.md").read_text() == readme.current(), (
        "charts/configpin/README.md is not current: run .venv/bin/python hack/chart-readme.py"
    )
    checked = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stderr


def test_every_value_has_a_described_row_with_its_default() -> None:
    readme = _script()
    values_text = (REPO / "charts" / "configpin" / "values.yaml").read_text()
    rows = readme.rows(values_text)
    keys = [row.key for row in rows]
    assert len(keys) == len(set(keys))
    assert set(keys) == _leaves(yaml.safe_load(values_text))
    assert all(row.description for row in rows), [r.key for r in rows if not r.description]
    by_key = {row.key: row for row in rows}
    assert by_key["hostNetwork.port"].default == 10443
    assert by_key["webhook.optInLabel.key"].default == "configpin.io/enabled"
    assert by_key["controller"].section and not by_key["controller.rolloutWindows"].section
    # the file's header and the commented-out examples are no key's description
    assert "Default values" not in by_key["nameOverride"].description
    assert "kind: allow" not in by_key["controller.rolloutWindows"].description


def test_the_check_fails_on_a_stale_readme(tmp_path: Path) -> None:
    readme = _script()
    values_text = (REPO / "charts" / "configpin" / "values.yaml").read_text()
    chart_yaml = (REPO / "charts" / "configpin" / "Chart.yaml").read_text()
    edited = values_text.replace("# Webhook replicas.", "# How many webhook replicas.", 1)
    assert readme.render(chart_yaml, edited) != readme.render(chart_yaml, values_text)
    assert "| `replicaCount` | `2` | How many webhook replicas." in readme.render(
        chart_yaml, edited
    )
    assert "&lt;release&gt;" in readme.render(chart_yaml, values_text)  # not an HTML tag
