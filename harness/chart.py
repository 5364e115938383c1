"""Render and lint charts/configpin with Helm's own library, no helm binary.

helm-python-sdk binds libhelm_c, Helm v4's Go SDK behind a C ABI, so rendering here runs the
same template engine, values coalescing and values.schema.json validation as `helm install`.

Shared by the chart unit tests and by the integration tests, which render for the version the
test API server reports (`cluster_capabilities`) and create the objects there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml
from helm_python import _native

CHART_DIR = Path(__file__).resolve().parents[1] / "charts" / "configpin"
RELEASE_NAME = "configpin"
RELEASE_NAMESPACE = "configpin-system"
DEFAULT_KUBE_VERSION = "1.30.0"

Manifest = dict[str, Any]


def render_files(
    values: Mapping[str, Any] | None = None,
    kube_version: str = DEFAULT_KUBE_VERSION,
    api_versions: Sequence[str] = (),
    *,
    release: str = RELEASE_NAME,
    namespace: str = RELEASE_NAMESPACE,
    is_upgrade: bool = False,
) -> dict[str, str]:
    """Render every template: {"configpin/templates/x.yaml": text}, NOTES.txt included.

    `kube_version` and `api_versions` are Helm's capabilities (`helm template --kube-version
    --api-versions`): the API versions are added to the set Helm assumes offline.
    """
    opts: dict[str, Any] = {
        "name": release,
        "namespace": namespace,
        "kube_version": kube_version,
        "api_versions": list(api_versions),
    }
    if is_upgrade:
        opts["is_upgrade"] = True
    with helm.Chart.load(CHART_DIR) as chart:
        # Chart.render() of helm-python-sdk 0.2.2 does not pass the capabilities through, but
        # helm_render takes them. Its options are decoded strictly (an unknown key is an
        # error, not ignored), so a library that stopped taking them fails here loudly.
        rendered = _native.call_string(
            "helm_render",
            chart._raw(),
            json.dumps(dict(values or {})),
            json.dumps(opts),
        )
    files: dict[str, str] = json.loads(rendered)
    return files


def render(
    values: Mapping[str, Any] | None = None,
    kube_version: str = DEFAULT_KUBE_VERSION,
    api_versions: Sequence[str] = (),
    *,
    release: str = RELEASE_NAME,
    namespace: str = RELEASE_NAMESPACE,
    is_upgrade: bool = False,
    tests: bool = False,
) -> list[Manifest]:
    """The chart's objects as dicts, in template-file order, as Helm would apply them: its
    `helm test` hooks (helm.sh/hook: test), which an install or upgrade never creates, only
    with `tests` (then only them)."""
    files = render_files(
        values,
        kube_version,
        api_versions,
        release=release,
        namespace=namespace,
        is_upgrade=is_upgrade,
    )
    objects: list[Manifest] = []
    for path in sorted(files):
        if path.endswith("NOTES.txt"):
            continue
        docs = (doc for doc in yaml.safe_load_all(files[path]) if doc)
        objects.extend(doc for doc in docs if is_test_hook(doc) is tests)
    return objects


def is_test_hook(obj: Manifest) -> bool:
    """A `helm test` hook: created by `helm test` alone."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    hooks = str(annotations.get("helm.sh/hook", "")).split(",")
    return any(h.strip() in ("test", "test-success") for h in hooks)


def notes(values: Mapping[str, Any] | None = None, **kwargs: Any) -> str:
    """The rendered NOTES.txt."""
    files = render_files(values, **kwargs)
    return next(text for path, text in files.items() if path.endswith("NOTES.txt"))


def lint(
    values: Mapping[str, Any] | None = None,
    kube_version: str = DEFAULT_KUBE_VERSION,
    *,
    namespace: str = RELEASE_NAMESPACE,
) -> dict[str, Any]:
    """`helm lint --strict` (warnings count as errors) of the chart directory."""
    report: dict[str, Any] = helm.lint(
        str(CHART_DIR),
        dict(values or {}),
        strict=True,
        namespace=namespace,
        kube_version=f"v{kube_version.removeprefix('v')}",
    )
    return report


def validate_values(values: Mapping[str, Any]) -> None:
    """Check values against values.schema.json; raises helm_python.HelmValuesError."""
    with helm.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(dict(values))


def select(objects: Iterable[Manifest], kind: str) -> list[Manifest]:
    return [o for o in objects if o.get("kind") == kind]


def one(objects: Iterable[Manifest], kind: str) -> Manifest:
    """The only object of `kind`; fails if there are none or several."""
    found = select(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def by_name(objects: Iterable[Manifest], kind: str, name: str) -> Manifest:
    found = [o for o in select(objects, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} named {name}, found {len(found)}"
    return found[0]


def cluster_capabilities(api_client: Any) -> tuple[str, list[str]]:
    """(kube version, API versions) of a live cluster, computed the way Helm does it.

    For an install, Helm takes the server's git version and a set holding every served
    group/version plus every "group/version/Kind" (helm's GetVersionSet over discovery).
    Pass the result to `render` to render for that cluster.
    `api_client` is a kubernetes.client.ApiClient.
    """
    version = _get(api_client, "/version")["gitVersion"]
    group_versions = list(_get(api_client, "/api")["versions"])
    for group in _get(api_client, "/apis")["groups"]:
        group_versions.extend(v["groupVersion"] for v in group["versions"])
    served: set[str] = set()
    for gv in group_versions:
        served.add(gv)
        path = f"/api/{gv}" if "/" not in gv else f"/apis/{gv}"
        for resource in _get(api_client, path)["resources"]:
            served.add(f"{gv}/{resource['kind']}")
    return version, sorted(served)


def _get(api_client: Any, path: str) -> dict[str, Any]:
    params = api_client.param_serialize(
        method="GET",
        resource_path=path,
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
    )
    response = api_client.call_api(*params)
    response.read()
    assert 200 <= response.status < 300, f"GET {path}: HTTP {response.status}"
    body: dict[str, Any] = json.loads(response.data)
    return body


CRDS = CHART_DIR / "crds"


def install_crds(api_client: Any, timeout: float = 60.0) -> list[str]:
    """The chart's CustomResourceDefinitions (crds/, as Helm installs them) created in the
    cluster, if not there yet, and served; their names."""
    from kubernetes import client

    from harness.controlplane import wait_for

    ext = client.ApiextensionsV1Api(api_client)
    names = []
    for file in sorted(CRDS.glob("*.yaml")):
        for doc in yaml.safe_load_all(file.read_text()):
            if not doc:
                continue
            names.append(doc["metadata"]["name"])
            try:
                ext.create_custom_resource_definition(doc)
            except client.ApiException as e:
                if e.status != 409:
                    raise

    def established(name: str) -> bool:
        crd = ext.read_custom_resource_definition(name)
        conditions = (crd.status.conditions if crd.status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    for name in names:
        wait_for(lambda n=name: established(n), timeout=timeout, what=f"CRD {name} established")
    return names
