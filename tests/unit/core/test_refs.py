"""Reference discovery: every source kind in every place a pod spec can consume one."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.conftest import (
    WORKLOAD_KINDS,
    container,
    env_cm,
    env_secret,
    envfrom_cm,
    envfrom_secret,
    pod_spec,
    proj_cm,
    proj_secret,
    spec_of,
    vol_cm,
    vol_projected,
    vol_secret,
    workload,
)
from webhook.core.kinds import template_paths
from webhook.core.model import JSONObject, SourceId, SourceKind
from webhook.core.refs import (
    CONTAINER_LISTS,
    Consumption,
    RefSite,
    consumption,
    find_sites,
    get_path,
)

CM = SourceKind.CONFIGMAP
SECRET = SourceKind.SECRET


def _in_list(clist: str, c: JSONObject) -> JSONObject:
    if clist == "containers":
        return pod_spec(c)
    if clist == "initContainers":
        return pod_spec(container("main"), init=[c])
    return pod_spec(container("main"), ephemeral=[c])


# ---- container references, in each container list ----


@pytest.mark.parametrize("clist", CONTAINER_LISTS)
@pytest.mark.parametrize(
    ("entry", "field", "kind", "name_field", "keys"),
    [
        (env_cm("cfg", "k"), "configMapKeyRef", CM, "name", frozenset({"k"})),
        (env_secret("cfg", "k"), "secretKeyRef", SECRET, "name", frozenset({"k"})),
    ],
    ids=["configMapKeyRef", "secretKeyRef"],
)
def test_env_value_from(
    clist: str,
    entry: JSONObject,
    field: str,
    kind: SourceKind,
    name_field: str,
    keys: frozenset[str],
) -> None:
    spec = _in_list(clist, container("c", env=[{"name": "PLAIN", "value": "x"}, entry]))
    (site,) = find_sites(spec)
    assert site.source == SourceId(kind, "cfg")
    assert site.path == (clist, 0, "env", 1, "valueFrom", field, name_field)
    assert site.keys == keys
    assert site.optional is False
    assert get_path(spec, site.path) == "cfg"


@pytest.mark.parametrize("clist", CONTAINER_LISTS)
@pytest.mark.parametrize(
    ("entry", "field", "kind"),
    [(envfrom_cm("cfg"), "configMapRef", CM), (envfrom_secret("cfg"), "secretRef", SECRET)],
    ids=["configMapRef", "secretRef"],
)
def test_env_from(clist: str, entry: JSONObject, field: str, kind: SourceKind) -> None:
    spec = _in_list(clist, container("c", env_from=[{"prefix": "X_"}, entry]))
    (site,) = find_sites(spec)
    assert site.source == SourceId(kind, "cfg")
    assert site.path == (clist, 0, "envFrom", 1, field, "name")
    assert site.keys is None  # envFrom consumes every key
    assert get_path(spec, site.path) == "cfg"


def test_containers_after_the_first_are_searched_too() -> None:
    spec = pod_spec(
        container("a"),
        container("b", env=[env_cm("second", "k")]),
        init=[container("i0"), container("i1", env_from=[envfrom_secret("init-secret")])],
        ephemeral=[container("debug", env=[env_secret("debug-secret", "token")])],
    )
    assert {(s.source, s.path[:2]) for s in find_sites(spec)} == {
        (SourceId(CM, "second"), ("containers", 1)),
        (SourceId(SECRET, "init-secret"), ("initContainers", 1)),
        (SourceId(SECRET, "debug-secret"), ("ephemeralContainers", 0)),
    }


# ---- volumes ----


def test_configmap_volume() -> None:
    spec = pod_spec(volumes=[{"name": "tmp", "emptyDir": {}}, vol_cm("cfg")])
    (site,) = find_sites(spec)
    assert site.source == SourceId(CM, "cfg")
    assert site.path == ("volumes", 1, "configMap", "name")
    assert site.keys is None


def test_secret_volume_is_named_by_secret_name() -> None:
    spec = pod_spec(volumes=[vol_secret("creds")])
    (site,) = find_sites(spec)
    assert site.source == SourceId(SECRET, "creds")
    assert site.path == ("volumes", 0, "secret", "secretName")
    assert get_path(spec, site.path) == "creds"


def test_secret_volume_with_name_instead_of_secret_name_is_no_reference() -> None:
    # `secret.name` is not a field of a secret volume: the API server drops it.
    spec = pod_spec(volumes=[{"name": "v", "secret": {"name": "creds"}}])
    assert find_sites(spec) == []


def test_projected_sources() -> None:
    spec = pod_spec(
        volumes=[
            vol_projected(
                {"serviceAccountToken": {"path": "token"}},
                proj_cm("cfg", items=["a"]),
                {"downwardAPI": {"items": [{"path": "labels"}]}},
                proj_secret("creds"),
            )
        ]
    )
    cm_site, secret_site = find_sites(spec)
    assert cm_site.source == SourceId(CM, "cfg")
    assert cm_site.path == ("volumes", 0, "projected", "sources", 1, "configMap", "name")
    assert cm_site.keys == frozenset({"a"})
    assert secret_site.source == SourceId(SECRET, "creds")
    assert secret_site.path == ("volumes", 0, "projected", "sources", 3, "secret", "name")
    assert secret_site.keys is None


@pytest.mark.parametrize("volume", [vol_cm, vol_secret, proj_cm, proj_secret])
def test_volume_items_limit_the_keys(volume: Callable[..., JSONObject]) -> None:
    vol = volume("src", items=["one", "two"])
    spec = pod_spec(volumes=[vol if "name" in vol else vol_projected(vol)])
    (site,) = find_sites(spec)
    assert site.keys == frozenset({"one", "two"})


def test_empty_items_mean_every_key() -> None:
    spec = pod_spec(volumes=[vol_cm("cfg", items=[])])
    (site,) = find_sites(spec)
    assert site.keys is None


@pytest.mark.parametrize(
    "spec",
    [
        pod_spec(volumes=[vol_cm("c", optional=True)]),
        pod_spec(volumes=[vol_secret("c", optional=True)]),
        pod_spec(volumes=[vol_projected(proj_cm("c", optional=True))]),
        pod_spec(container(env=[env_cm("c", "k", optional=True)])),
        pod_spec(container(env=[env_secret("c", "k", optional=True)])),
        pod_spec(container(env_from=[envfrom_cm("c", optional=True)])),
        pod_spec(container(env_from=[envfrom_secret("c", optional=True)])),
    ],
)
def test_optional_is_read_from_every_reference_kind(spec: JSONObject) -> None:
    (site,) = find_sites(spec)
    assert site.optional is True


def test_optional_false_or_absent_is_required() -> None:
    spec = pod_spec(volumes=[vol_cm("a", optional=False), vol_cm("b")])
    assert [s.optional for s in find_sites(spec)] == [False, False]


def test_sites_come_in_document_order_volumes_first() -> None:
    spec = pod_spec(
        container(env=[env_cm("e", "k")], env_from=[envfrom_secret("f")]),
        init=[container("init", env_from=[envfrom_cm("i")])],
        volumes=[vol_secret("v1"), vol_cm("v2")],
    )
    assert [s.source.name for s in find_sites(spec)] == ["v1", "v2", "i", "e", "f"]


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"containers": None, "volumes": None},
        {"containers": "nonsense", "volumes": [None, 3, "x"]},
        {"containers": [None, {"env": [None, {"name": "A"}, {"valueFrom": None}]}]},
        {"containers": [{"env": [{"valueFrom": {"configMapKeyRef": {"name": "c"}}}]}]},  # no key
        {"containers": [{"envFrom": [{"configMapRef": {}}, {"secretRef": {"name": ""}}]}]},
        {"volumes": [{"configMap": {"name": 5}}, {"secret": "creds"}, {"projected": {}}]},
        {"volumes": [{"projected": {"sources": [None, {"configMap": None}]}}]},
    ],
)
def test_malformed_specs_give_no_references_and_no_error(spec: JSONObject) -> None:
    assert find_sites(spec) == []


# ---- consumption: sites grouped by source ----


def test_consumption_unions_keys_of_one_source() -> None:
    spec = pod_spec(
        container(env=[env_cm("cfg", "a"), env_cm("cfg", "b", var="B")]),
        volumes=[vol_cm("cfg", items=["c"])],
    )
    (cons,) = consumption(find_sites(spec)).values()
    assert cons.source == SourceId(CM, "cfg")
    assert cons.keys == frozenset({"a", "b", "c"})
    assert cons.required is True
    assert cons.required_keys == frozenset({"a", "b", "c"})
    assert len(cons.sites) == 3


def test_consumption_of_every_key_wins_over_single_keys() -> None:
    spec = pod_spec(
        container(env=[env_cm("cfg", "a")], env_from=[envfrom_cm("cfg")]),
    )
    (cons,) = consumption(find_sites(spec)).values()
    assert cons.keys is None


def test_consumption_required_only_when_a_site_is_required() -> None:
    spec = pod_spec(
        container(env=[env_cm("cfg", "a", optional=True), env_cm("cfg", "b", optional=False)]),
        volumes=[vol_secret("s", optional=True)],
    )
    grouped = consumption(find_sites(spec))
    cfg = grouped[SourceId(CM, "cfg")]
    assert cfg.required is True
    assert cfg.required_keys == frozenset({"b"})  # `a` may be missing
    assert grouped[SourceId(SECRET, "s")].required is False


def test_configmap_and_secret_of_one_name_are_different_sources() -> None:
    spec = pod_spec(container(env_from=[envfrom_cm("same"), envfrom_secret("same")]))
    assert sorted(consumption(find_sites(spec))) == [SourceId(CM, "same"), SourceId(SECRET, "same")]


def test_consumption_is_sorted_by_source() -> None:
    spec = pod_spec(container(env_from=[envfrom_secret("b"), envfrom_cm("z"), envfrom_cm("a")]))
    assert [str(s) for s in consumption(find_sites(spec))] == [
        "configmap/a",
        "configmap/z",
        "secret/b",
    ]


def _grouped_by_dict(sites: list[RefSite]) -> list[Consumption]:
    """What `consumption` computes, written plainly: grouped in a dict in document order,
    sorted by the SourceId tuples."""
    grouped: dict[SourceId, list[RefSite]] = {}
    for site in sites:
        grouped.setdefault(site.source, []).append(site)
    out = []
    for source in sorted(grouped):
        group = grouped[source]
        keys: frozenset[str] | None = frozenset()
        required_keys: frozenset[str] = frozenset()
        for s in group:
            keys = None if s.keys is None or keys is None else keys | s.keys
            if not s.optional and s.keys is not None:
                required_keys |= s.keys
        required = any(not s.optional for s in group)
        out.append(Consumption(source, keys, required, required_keys, tuple(group)))
    return out


_NAMES = st.sampled_from(["a", "a-b", "a/b", "a.b", "b", "z", "\u00e9", ""])
_SITES = st.builds(
    RefSite,
    st.builds(SourceId, st.sampled_from(list(SourceKind)), _NAMES),
    st.tuples(st.sampled_from(["volumes", "containers"]), st.integers(0, 3)),
    st.none() | st.frozensets(st.sampled_from(["k1", "k2", "k3"]), max_size=2),
    st.booleans(),
)


@given(st.lists(_SITES, max_size=12))
def test_consumption_groups_and_orders_as_a_dict_of_sources_would(sites: list[RefSite]) -> None:
    assert list(consumption(sites).values()) == _grouped_by_dict(sites)


# ---- where each workload kind keeps its pod template ----


@pytest.mark.parametrize("kind", WORKLOAD_KINDS)
def test_template_paths_of_every_workload_kind(kind: str) -> None:
    spec = pod_spec(container(env_from=[envfrom_cm("cfg")]))
    obj = workload(kind, spec)
    paths = template_paths(kind)
    assert paths is not None
    meta_path, spec_path = paths
    assert get_path(obj, spec_path) is spec_of(obj)
    assert isinstance(get_path(obj, meta_path), dict)
    (site,) = find_sites(get_path(obj, spec_path))
    assert site.source == SourceId(CM, "cfg")


def test_cronjob_template_is_under_job_template() -> None:
    assert template_paths("CronJob") == (
        ("spec", "jobTemplate", "spec", "template", "metadata"),
        ("spec", "jobTemplate", "spec", "template", "spec"),
    )


@pytest.mark.parametrize("kind", ["Service", "ConfigMap", "Secret", "PodTemplate", "", "pod"])
def test_other_kinds_are_not_handled(kind: str) -> None:
    assert template_paths(kind) is None


def test_get_path() -> None:
    obj = {"a": [{"b": 1}]}
    assert get_path(obj, ("a", 0, "b")) == 1
    assert get_path(obj, ("a", 1, "b")) is None
    assert get_path(obj, ("a", "b")) is None
    assert get_path(obj, ("a", 0, "b", "c")) is None
    assert get_path(obj, ()) is obj
