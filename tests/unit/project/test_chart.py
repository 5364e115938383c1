"""The Helm chart and the container image: rendered and linted with Helm's own library."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

import helm_python as helm
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from harness.chart import (
    CHART_DIR,
    RELEASE_NAMESPACE,
    Manifest,
    by_name,
    lint,
    notes,
    one,
    render,
    select,
    validate_values,
)
from harness.images import dockerfile_instructions, dockerfile_stages
from webhook.commands.cli import build_parser
from webhook.core.budget import Budget
from webhook.core.durations import HOUR, SECOND
from webhook.core.kinds import BUILTIN_KINDS
from webhook.core.model import SourceKind
from webhook.inputs.sources import FileSources
from webhook.process.config import Settings
from webhook.process.metrics import Metrics
from webhook.server.handler import SOURCES_PATH, WORKLOADS_PATH, Admitter

ROOT = CHART_DIR.parents[1]
NON_DEFAULT = {
    "certManager": {"enabled": True},
    "webhook": {"failurePolicy": "Fail"},
    "replicaCount": 3,
    "mode": "snapshot",
    "argoRollouts": False,
    "workloadKinds": ["apps.kruise.io/v1alpha1/clonesets/CloneSet=spec.template"],
}
ARGO = ("argoproj.io", "v1alpha1", "rollouts")
CLONESET_ENTRY = "apps.kruise.io/v1alpha1/clonesets/CloneSet=spec.template"
CLONESET = ("apps.kruise.io", "v1alpha1", "clonesets")
# What the chart must grant and register, from the one table of kinds (webhook/core/kinds.py):
# a kind added on either side without the other fails the tests below.
WORKLOAD_RULES = {(k.group, k.resource) for k in BUILTIN_KINDS if k.admitted}  # admission
WORKLOAD_READS = {(k.group, k.resource) for k in BUILTIN_KINDS}  # the controller's watches
WORKLOAD_PATCHES = {(k.group, k.resource) for k in BUILTIN_KINDS if k.rolls}  # re-stamps
# ... and of the source kinds (webhook/core/model.py: SOURCE_FACTS): read, copied in snapshot
# mode, and their writes previewed
SOURCES = {("", k.resource) for k in SourceKind}
SOURCE_RESOURCES = [k.resource for k in SourceKind]


@pytest.fixture(scope="module")
def default() -> list[Manifest]:
    return render({})


@pytest.fixture(scope="module")
def custom() -> list[Manifest]:
    return render(NON_DEFAULT)


@pytest.fixture(params=["default", "custom"])
def objects(request: pytest.FixtureRequest) -> list[Manifest]:
    rendered: list[Manifest] = request.getfixturevalue(request.param)
    return rendered


# --- helpers -------------------------------------------------------------------------------


def container(objects: list[Manifest]) -> dict[str, Any]:
    containers = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    found: dict[str, Any] = containers[0]
    return found


def flags(objects: list[Manifest]) -> dict[str, str | None]:
    """The container's `serve` flags: {"--mode": "checksum", "--strict": None, ...}."""
    args = container(objects)["args"]
    assert args[0] == "serve"
    parsed: dict[str, str | None] = {}
    for arg in args[1:]:
        name, _, value = arg.partition("=")
        assert name not in parsed, f"{name} given twice"
        parsed[name] = value if "=" in arg else None
    return parsed


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Kubernetes LabelSelector semantics."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels[key] not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[op]
        if not ok:
            return False
    return True


def namespace_labels(name: str, *, enabled: bool) -> dict[str, str]:
    labels = {"kubernetes.io/metadata.name": name}
    if enabled:
        labels["configpin.io/enabled"] = "true"
    return labels


def comment_before(template: str, needle: str) -> str:
    """The comment right above the list item or field holding `needle` in a template."""
    lines = (CHART_DIR / "templates" / template).read_text().splitlines()
    at = next(n for n, line in enumerate(lines) if needle in line)
    while not lines[at].lstrip().startswith(("- ", "#")) and not lines[at - 1].lstrip().startswith(
        "#"
    ):
        at -= 1
    comment: list[str] = []
    for line in reversed(lines[:at]):
        stripped = line.strip()
        if not stripped.startswith("#"):
            break
        comment.insert(0, stripped.lstrip("# "))
    return " ".join(comment)


def rbac_grants(role: Manifest) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """Every (apiGroup, resource, verb, resourceNames) a Role or ClusterRole grants."""
    return {
        (group, resource, verb, tuple(rule.get("resourceNames", ())))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


# --- Helm: lint, Chart.yaml, schema --------------------------------------------------------


@pytest.mark.parametrize("kube_version", ["1.20.2", "1.30.0"])
@pytest.mark.parametrize("values", [{}, NON_DEFAULT], ids=["default", "custom"])
def test_helm_lint_strict_is_clean(values: dict[str, Any], kube_version: str) -> None:
    report = lint(values, kube_version)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems, problems
    assert not report["errors"], report["errors"]


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "configpin"
    assert chart["kubeVersion"] == ">=1.20.0-0"


def test_schema_is_draft_07_closed_with_enums() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False
    assert schema["properties"]["mode"]["enum"] == ["checksum", "snapshot", "off"]
    webhook = schema["properties"]["webhook"]["properties"]
    assert webhook["failurePolicy"]["enum"] == ["Ignore", "Fail"]
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert set(defaults) <= set(schema["properties"])


@pytest.mark.parametrize(
    "values",
    [
        {"mode": "bogus"},
        {"webhook": {"failurePolicy": "Maybe"}},
        {"webhook": {"timeoutSeconds": 31}},
        {"replicaCount": 0},
        {"unknownTopLevelKey": True},
        {"webhook": {"failurPolicy": "Fail"}},
    ],
    ids=["mode", "failurePolicy", "timeout", "replicas", "unknown-key", "typo-nested"],
)
def test_schema_rejects_bad_values(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        validate_values(values)
    with pytest.raises(helm.HelmValuesError):
        render(values)


def test_schema_accepts_defaults_and_non_default_values() -> None:
    validate_values({})
    validate_values(NON_DEFAULT)


def test_every_value_has_a_comment() -> None:
    """A `key:` line in values.yaml is preceded by a comment line (blank lines aside)."""
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    undocumented = []
    previous = ""
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if re.match(r"^[A-Za-z0-9_]+:", stripped) and not previous.startswith("#"):
            undocumented.append(f"values.yaml:{number}: {stripped}")
        previous = stripped
    assert not undocumented, undocumented


def test_notes_tell_how_to_opt_in_and_check() -> None:
    text = notes({})
    assert "kubectl label namespace NAME configpin.io/enabled=true" in text
    assert "rollout status deployment/configpin" in text
    assert "configpin\\.io/sources" in text


# --- all objects -------------------------------------------------------------------------


CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration"}


def test_objects_carry_standard_labels_and_namespace(objects: list[Manifest]) -> None:
    for obj in objects:
        meta = obj["metadata"]
        labels = meta["labels"]
        assert labels["app.kubernetes.io/name"] == "configpin"
        assert labels["app.kubernetes.io/instance"] == "configpin"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert "app.kubernetes.io/version" in labels
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta
        else:
            assert meta["namespace"] == RELEASE_NAMESPACE


def test_default_kinds(default: list[Manifest]) -> None:
    assert sorted(o["kind"] for o in default) == sorted(
        [
            "ClusterRole",
            "ClusterRole",  # (the ConfigRollouts' view role)
            "ClusterRoleBinding",
            "Deployment",
            "MutatingWebhookConfiguration",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ]
    )


# --- Deployment ----------------------------------------------------------------------------


def test_replicas_and_spread_across_nodes(default: list[Manifest], custom: list[Manifest]) -> None:
    assert one(default, "Deployment")["spec"]["replicas"] == 2
    assert one(custom, "Deployment")["spec"]["replicas"] == 3
    pod = one(default, "Deployment")["spec"]["template"]
    spread = pod["spec"]["topologySpreadConstraints"]
    by_node = [c for c in spread if c["topologyKey"] == "kubernetes.io/hostname"]
    assert len(by_node) == 1
    assert by_node[0]["maxSkew"] == 1
    assert selects(by_node[0]["labelSelector"], pod["metadata"]["labels"])
    anti = pod["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    strategy = one(default, "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxUnavailable"] == 0


def test_probes_use_https(objects: list[Manifest]) -> None:
    c = container(objects)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"https": 8443}
    ready, live = c["readinessProbe"]["httpGet"], c["livenessProbe"]["httpGet"]
    assert ready == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert live == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}


def test_resources_are_set(objects: list[Manifest]) -> None:
    resources = container(objects)["resources"]
    assert resources["requests"]["cpu"]
    assert resources["requests"]["memory"]
    assert resources["limits"]["memory"]


# What the Pod Security Standards allow under "restricted" (volumes by type).
RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(pod_spec: Mapping[str, Any]) -> list[str]:
    """The Pod Security Standards "restricted" profile (v1.20+ rules), plus a read-only root."""
    problems = []
    pod_sc = pod_spec.get("securityContext", {})
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(host):
            problems.append(host)
    for volume in pod_spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            problems.append(f"volume {volume['name']}: {kinds}")
    if pod_sc.get("runAsUser") == 0:
        problems.append("pod runAsUser 0")
    all_containers = [*pod_spec.get("initContainers", []), *pod_spec["containers"]]
    for c in all_containers:
        sc = c.get("securityContext", {})
        name = c["name"]
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation not false")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            problems.append(f"{name}: runAsNonRoot not true")
        run_as_user = sc.get("runAsUser", pod_sc.get("runAsUser"))
        if not isinstance(run_as_user, int) or run_as_user == 0:
            problems.append(f"{name}: runAsUser not a non-zero number")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            problems.append(f"{name}: capabilities not dropping ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: capabilities added")
        if any("hostPort" in p for p in c.get("ports", [])):
            problems.append(f"{name}: hostPort")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: root filesystem writable")
    return problems


def test_pod_passes_pod_security_restricted(objects: list[Manifest]) -> None:
    pod_spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert restricted_violations(pod_spec) == []
    c = container(objects)
    assert c["securityContext"]["runAsUser"] == 65532
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod_spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # Read-only root, so Python gets a writable /tmp.
    tmp = next(m for m in c["volumeMounts"] if m["mountPath"] == "/tmp")
    volume = next(v for v in pod_spec["volumes"] if v["name"] == tmp["name"])
    assert "emptyDir" in volume


def test_restricted_checker_catches_violations() -> None:
    bad = {
        "hostNetwork": True,
        "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
        "containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}],
    }
    problems = restricted_violations(bad)
    assert "hostNetwork" in problems
    assert any("allowPrivilegeEscalation" in p for p in problems)
    assert any("capabilities added" in p for p in problems)
    assert any(p.startswith("volume h") for p in problems)


def test_grace_period_outlasts_shutdown_delay_and_drain(objects: list[Manifest]) -> None:
    pod_spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    given = flags(objects)
    delay = float(given["--shutdown-delay"] or "nan")
    drain = float(given["--drain-timeout"] or "nan")
    timeout = one(objects, "MutatingWebhookConfiguration")["webhooks"][0]["timeoutSeconds"]
    assert drain >= timeout
    assert pod_spec["terminationGracePeriodSeconds"] > delay + drain


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"terminationGracePeriodSeconds": 20, "drainTimeoutSeconds": 15}, "terminationGrace"),
        ({"drainTimeoutSeconds": 3, "webhook": {"timeoutSeconds": 10}}, "drainTimeoutSeconds"),
    ],
)
def test_unsafe_shutdown_timings_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render(values)


def test_args_are_what_configpin_serve_accepts(
    objects: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real CLI parses the rendered arguments into valid settings."""
    monkeypatch.setenv("POD_NAMESPACE", RELEASE_NAMESPACE)
    args = build_parser().parse_args(container(objects)["args"])
    assert args.command == "serve"
    settings = Settings(**{k: v for k, v in vars(args).items() if k != "command" and v is not None})
    given = flags(objects)
    assert settings.server.port == 8443
    assert settings.admission.mode == given["--mode"]
    assert settings.admission.digest_key_secret == given["--digest-key-secret"]
    assert settings.certs.self_signed is ("--self-signed-certs" in given)
    assert settings.controller.leader_elect is True
    assert settings.admission.strict is False
    env = {e["name"]: e for e in container(objects)["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_flags_default(default: list[Manifest]) -> None:
    given = flags(default)
    assert given["--mode"] == "checksum"
    assert "--no-strict" in given
    assert "--leader-elect" in given
    webhook = one(default, "MutatingWebhookConfiguration")
    assert given["--webhook-config-name"] == webhook["metadata"]["name"]
    assert "--self-signed-certs" in given
    assert given["--service-name"] == one(default, "Service")["metadata"]["name"]
    assert "--tls-cert" not in given


def test_controller_acts_where_the_webhook_does(default: list[Manifest]) -> None:
    selector = flags(default)["--namespace-selector"]
    assert selector == (
        "configpin.io/enabled=true,"
        f"kubernetes.io/metadata.name notin (kube-system,{RELEASE_NAMESPACE})"
    )


def test_flags_non_default(custom: list[Manifest]) -> None:
    given = flags(custom)
    assert given["--mode"] == "snapshot"
    assert given["--tls-cert"] == "/certs/tls.crt"
    assert given["--tls-key"] == "/certs/tls.key"
    assert "--self-signed-certs" not in given
    assert "--webhook-config-name" not in given
    assert "--strict" in flags(render({"strict": True}))
    # `--leader-elect` is on unless turned off: leaving the flag out would not do.
    no_election = flags(render({"controller": {"leaderElect": False}}))
    assert "--no-leader-elect" in no_election
    assert "--leader-elect" not in no_election


def test_self_managed_certs_mount_nothing(default: list[Manifest]) -> None:
    pod_spec = one(default, "Deployment")["spec"]["template"]["spec"]
    assert [v["name"] for v in pod_spec["volumes"]] == ["tmp"]
    assert (
        "caBundle"
        not in one(default, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]
    )


def test_cert_manager_issues_and_mounts_the_serving_certificate(custom: list[Manifest]) -> None:
    service = one(custom, "Service")["metadata"]["name"]
    issuers = {i["metadata"]["name"]: i for i in select(custom, "Issuer")}
    certs = {c["metadata"]["name"]: c for c in select(custom, "Certificate")}
    assert len(issuers) == 2
    assert len(certs) == 2
    ca = next(c for c in certs.values() if c["spec"].get("isCA"))
    assert "selfSigned" in issuers[ca["spec"]["issuerRef"]["name"]]["spec"]
    serving = next(c for c in certs.values() if not c["spec"].get("isCA"))
    ca_issuer = issuers[serving["spec"]["issuerRef"]["name"]]
    assert ca_issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    assert f"{service}.{RELEASE_NAMESPACE}.svc" in serving["spec"]["dnsNames"]
    assert "server auth" in serving["spec"]["usages"]
    annotations = one(custom, "MutatingWebhookConfiguration")["metadata"]["annotations"]
    inject = annotations["cert-manager.io/inject-ca-from"]
    assert inject == f"{RELEASE_NAMESPACE}/{serving['metadata']['name']}"
    # The serving certificate's Secret is mounted where --tls-cert points.
    pod_spec = one(custom, "Deployment")["spec"]["template"]["spec"]
    mount = next(m for m in container(custom)["volumeMounts"] if m["mountPath"] == "/certs")
    volume = next(v for v in pod_spec["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == serving["spec"]["secretName"]
    assert mount["readOnly"] is True


# --- Service, ServiceAccount ---------------------------------------------------------------


def test_service_routes_443_to_the_pods(objects: list[Manifest]) -> None:
    service = one(objects, "Service")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}
    ]
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels)


def test_pods_run_as_the_bound_service_account(objects: list[Manifest]) -> None:
    account = one(objects, "ServiceAccount")["metadata"]["name"]
    pod_spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod_spec["serviceAccountName"] == account
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        binding = one(objects, kind)
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": RELEASE_NAMESPACE}
        ]
        role_kind = "ClusterRole" if kind == "ClusterRoleBinding" else "Role"
        assert binding["roleRef"]["kind"] == role_kind
        role = cluster_role(objects) if role_kind == "ClusterRole" else one(objects, role_kind)
        assert binding["roleRef"]["name"] == role["metadata"]["name"]


# --- RBAC ----------------------------------------------------------------------------------


def test_no_wildcards_in_rbac(objects: list[Manifest]) -> None:
    roles = select(objects, "ClusterRole") + select(objects, "Role")
    assert len(roles) == 3  # (configpin's two, and the ConfigRollouts' view role)
    for role in roles:
        for rule in role["rules"]:
            assert "nonResourceURLs" not in rule
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                for item in rule.get(field, []):
                    assert "*" not in item, (role["kind"], rule)


READ = ("get", "list", "watch")
ROLLOUTS = ("configpin.io", "configrollouts")


def cluster_role(objects: list[Manifest]) -> Manifest:
    """configpin's own ClusterRole: the one its ClusterRoleBinding binds."""
    return by_name(objects, "ClusterRole", one(objects, "ClusterRoleBinding")["roleRef"]["name"])


def test_configrollouts_are_read_through_the_aggregated_view_role(objects: list[Manifest]) -> None:
    """Whoever may view a namespace may read its ConfigRollouts (the built-in view, edit and
    admin roles aggregate the chart's role), and nothing more: no write, no other resource."""
    [view] = [r for r in select(objects, "ClusterRole") if r is not cluster_role(objects)]
    labels = view["metadata"]["labels"]
    for role in ("view", "edit", "admin"):
        assert labels[f"rbac.authorization.k8s.io/aggregate-to-{role}"] == "true"
    assert rbac_grants(view) == {(*ROLLOUTS, v, ()) for v in READ}
    assert not [
        b
        for b in select(objects, "ClusterRoleBinding")
        if b["roleRef"]["name"] == view["metadata"]["name"]
    ]


def expected_cluster_grants(
    *,
    snapshots: bool,
    webhook: str | None,
    custom: Sequence[tuple[str, str, str]] = (ARGO,),
    refresh_pods: bool = True,
) -> set[Any]:
    # a custom workload kind: read and re-stamped, that resource only
    grants = {(g, r, v, ()) for g, _, r in custom for v in (*READ, "patch")}
    grants |= {
        (g, r, v, ()) for g, r in {*SOURCES, ("", "namespaces"), *WORKLOAD_READS} for v in READ
    }
    grants |= {(g, r, "patch", ()) for g, r in WORKLOAD_PATCHES}
    grants |= {("events.k8s.io", "events", v, ()) for v in ("create", "patch")}
    # the ConfigRollouts it publishes (output only), their status through its subresource
    grants |= {(*ROLLOUTS, v, ()) for v in (*READ, "create", "update", "delete")}
    grants.add(("configpin.io", "configrollouts/status", "update", ()))
    if refresh_pods:  # on-change: refresh, one annotation on a workload's running pods
        grants.add(("", "pods", "patch", ()))
    if snapshots:
        grants |= {(g, r, v, ()) for g, r in SOURCES for v in ("create", "delete", "patch")}
    if webhook:
        group = "admissionregistration.k8s.io"
        grants |= {
            (group, "mutatingwebhookconfigurations", v, (webhook,)) for v in ("get", "patch")
        }
    return grants


def test_cluster_role_is_exactly_least_privilege(
    default: list[Manifest], custom: list[Manifest]
) -> None:
    webhook = one(default, "MutatingWebhookConfiguration")["metadata"]["name"]
    # Checksum mode (the default) never writes a ConfigMap or Secret: no such grant.
    assert rbac_grants(cluster_role(default)) == expected_cluster_grants(
        snapshots=False, webhook=webhook
    )
    assert flags(default)["--no-snapshots"] is None
    # mode: snapshot implies the writes. With cert-manager, configpin never touches its
    # webhook configuration.
    assert rbac_grants(cluster_role(custom)) == expected_cluster_grants(
        snapshots=True, webhook=None, custom=[CLONESET]
    )
    assert flags(custom)["--workload-kinds"] == NON_DEFAULT["workloadKinds"][0]
    assert flags(custom)["--no-argo-rollouts"] is None
    assert flags(default)["--argo-rollouts"] is None
    assert flags(custom)["--snapshots"] is None
    allowed = render({"snapshots": {"enabled": True}})
    assert rbac_grants(cluster_role(allowed)) == expected_cluster_grants(
        snapshots=True, webhook=webhook
    )
    assert flags(allowed)["--snapshots"] is None
    # controller.refreshPods off: no pod write granted, and configpin told so (they roll).
    assert flags(default)["--refresh-pods"] is None
    no_refresh = render({"controller": {"refreshPods": False}})
    assert rbac_grants(cluster_role(no_refresh)) == expected_cluster_grants(
        snapshots=False, webhook=webhook, refresh_pods=False
    )
    assert flags(no_refresh)["--no-refresh-pods"] is None


def test_the_policy_is_rendered_only_where_served() -> None:
    vap = ["admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"]
    for kube_version, api_versions, expected in (
        ("1.36.2", vap, True),
        ("1.30.0", vap, True),
        ("1.29.0", vap, False),  # offline rendering assumes every API Helm knows
        ("1.20.2", [], False),
    ):
        kinds = {o["kind"] for o in render({}, kube_version, api_versions)}
        assert ("ValidatingAdmissionPolicy" in kinds) is expected, kube_version
        assert ("ValidatingAdmissionPolicyBinding" in kinds) is expected, kube_version
    off = render({"validatingAdmissionPolicy": {"enabled": False}}, "1.36.2", vap)
    assert "ValidatingAdmissionPolicy" not in {o["kind"] for o in off}
    [policy] = select(render({}, "1.36.2", vap), "ValidatingAdmissionPolicy")
    [condition] = policy["spec"]["matchConditions"]
    assert f"system:serviceaccount:{RELEASE_NAMESPACE}:" in condition["expression"]


def test_client_auth_and_network_policy() -> None:
    objects = render(
        {
            "clientAuth": {"caConfigMap": "apiserver-client-ca"},
            "networkPolicy": {
                "enabled": True,
                "from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}],
            },
        }
    )
    assert flags(objects)["--client-ca"] == "/client-ca/ca.crt"
    c = container(objects)
    assert "tcpSocket" in c["readinessProbe"] and "tcpSocket" in c["livenessProbe"]
    policy = one(objects, "NetworkPolicy")
    assert policy["spec"]["ingress"][0]["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    assert "--client-ca" not in flags(render({}))


def test_excluded_namespaces_and_the_read_deadline_reach_the_server() -> None:
    objects = render({"webhook": {"excludeNamespaces": ["a", "b"], "timeoutSeconds": 10}})
    args = container(objects)["args"]
    assert "--exclude-namespaces=a" in args and "--exclude-namespaces=b" in args
    assert "--read-deadline=8" in args
    assert flags(render({"webhook": {"timeoutSeconds": 2}}))["--read-deadline"] == "0.5"


# --- rollout windows and the flap guard (issue 40) ----------------------------------------


def _serve_settings(objects: list[Manifest]) -> Settings:
    """The settings `configpin serve` reads from the rendered arguments, as it would at start
    (a value it cannot read raises there, as it stops configpin)."""
    args = build_parser().parse_args(container(objects)["args"])
    return Settings(**{k: v for k, v in vars(args).items() if k != "command" and v is not None})


def _values_example(key: str) -> Any:
    """The commented example right below `key:` in values.yaml, uncommented and read, as a
    user who copies it would."""
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    at = next(n for n, line in enumerate(lines) if line.strip().startswith(f"{key}:"))
    block = []
    for line in lines[at + 1 :]:
        if not line.strip().startswith("#  "):
            break
        block.append(line.strip().removeprefix("#"))
    assert block, f"values.yaml has no example below {key}"
    return yaml.safe_load("\n".join(block))


def test_rollout_windows_and_budget_default_to_always_and_6_per_hour(
    default: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAMESPACE", RELEASE_NAMESPACE)
    given = flags(default)
    assert given["--rollout-windows"] == "[]"
    assert given["--rollout-budget"] == "6/1h"
    settings = _serve_settings(default)
    assert settings.rollout.windows == ()
    assert settings.rollout.budget == Budget(6, HOUR)


def test_the_windows_example_in_values_yaml_is_what_configpin_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The example a user copies from values.yaml passes the schema, renders, and is read by
    configpin as written: business hours in Berlin, and a deny from Friday afternoon on."""
    monkeypatch.setenv("POD_NAMESPACE", RELEASE_NAMESPACE)
    example = _values_example("rolloutWindows")
    values = {"controller": {"rolloutWindows": example, "rolloutBudget": "2/30s"}}
    validate_values(values)
    objects = render(values)
    assert json.loads(flags(objects)["--rollout-windows"] or "") == example
    settings = _serve_settings(objects)
    allow, deny = settings.rollout.windows
    assert (allow.kind, allow.schedule, allow.seconds, allow.time_zone) == (
        "allow",
        "0 9 * * 1-5",
        8 * 3600,
        "Europe/Berlin",
    )
    assert (deny.kind, deny.schedule, deny.seconds) == ("deny", "0 15 * * 5", 66 * 3600)
    assert settings.rollout.budget == Budget(2, 30 * SECOND)
    report = lint(values)
    assert not [m for m in report["messages"] if m["severity"] >= 2]


def test_a_window_list_reaches_configpin_as_written_whatever_its_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The list is one argument: quotes, backslashes, a colon and a hash, markup and non-ASCII
    in a description neither break the YAML nor change the JSON configpin reads."""
    monkeypatch.setenv("POD_NAMESPACE", RELEASE_NAMESPACE)
    awkward = 'it\'s "the sale": no rollouts # really \\ <b>&amp;</b> Grüße, {x}'
    windows = [
        {
            "kind": "deny",
            "schedule": "0 22 * * FRI",
            "duration": "1h30m",
            "description": awkward,
        }
    ]
    objects = render({"controller": {"rolloutWindows": windows}})
    assert json.loads(flags(objects)["--rollout-windows"] or "") == windows
    [window] = _serve_settings(objects).rollout.windows
    assert (window.schedule, window.seconds, window.time_zone) == ("0 22 * * FRI", 5400, "UTC")


def test_no_rollout_budget_is_0_as_text_or_as_a_number(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--set controller.rolloutBudget=0` gives Helm the number 0: it turns the budget off
    as "0" does."""
    monkeypatch.setenv("POD_NAMESPACE", RELEASE_NAMESPACE)
    for off in (0, "0"):
        objects = render({"controller": {"rolloutBudget": off}})
        assert flags(objects)["--rollout-budget"] == "0"
        assert _serve_settings(objects).rollout.budget.unlimited


_WINDOW = {"kind": "allow", "schedule": "0 9 * * 1-5", "duration": "8h"}


@pytest.mark.parametrize(
    ("controller", "refused_at"),
    [
        ({"rolloutBudget": "6 per hour"}, "/controller/rolloutBudget"),
        ({"rolloutBudget": "6/"}, "/controller/rolloutBudget"),
        ({"rolloutBudget": "6/1hour"}, "/controller/rolloutBudget"),
        ({"rolloutBudget": "0/1h"}, "/controller/rolloutBudget"),
        ({"rolloutBudget": "101/1h"}, "/controller/rolloutBudget"),
        ({"rolloutBudget": "-6/1h"}, "/controller/rolloutBudget"),
        ({"rolloutBudget": 6}, "/controller/rolloutBudget"),
        ({"rolloutWindows": {**_WINDOW}}, "/controller/rolloutWindows"),
        ({"rolloutWindows": "[]"}, "/controller/rolloutWindows"),
        ({"rolloutWindows": [{**_WINDOW, "kind": "Allow"}]}, "/controller/rolloutWindows/0/kind"),
        ({"rolloutWindows": [{"kind": "deny", "duration": "1h"}]}, "/controller/rolloutWindows/0"),
        ({"rolloutWindows": [{**_WINDOW, "schedule": "0 9 * *"}]}, "/0/schedule"),
        ({"rolloutWindows": [{**_WINDOW, "schedule": "0 0 9 * * 1-5"}]}, "/0/schedule"),
        ({"rolloutWindows": [{**_WINDOW, "schedule": "@daily"}]}, "/0/schedule"),
        ({"rolloutWindows": [{**_WINDOW, "schedule": "0 9 ? * MON#1"}]}, "/0/schedule"),
        ({"rolloutWindows": [{**_WINDOW, "duration": 8}]}, "/0/duration"),
        ({"rolloutWindows": [{**_WINDOW, "duration": "8 hours"}]}, "/0/duration"),
        ({"rolloutWindows": [{**_WINDOW, "duration": "-8h"}]}, "/0/duration"),
        ({"rolloutWindows": [{**_WINDOW, "timeZone": "CET+1 hour"}]}, "/0/timeZone"),
        ({"rolloutWindows": [{**_WINDOW, "timeZone": "localtime"}]}, "/0/timeZone"),
        ({"rolloutWindows": [{**_WINDOW, "manualSync": True}]}, "/controller/rolloutWindows/0"),
        ({"rolloutWindows": [{**_WINDOW, "timezone": "UTC"}]}, "/controller/rolloutWindows/0"),
        ({"rolloutWindows": [_WINDOW] * 65}, "/controller/rolloutWindows"),
    ],
)
def test_the_schema_refuses_a_window_list_or_budget_configpin_cannot_read(
    controller: dict[str, Any], refused_at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At `helm install`, naming the value, rather than a configpin that stops at start (in
    a rolling update: a new replica that never becomes ready). Each value refused here is one
    configpin refuses too: the schema is never the stricter of the two."""
    with pytest.raises(helm.HelmValuesError, match=re.escape(refused_at)):
        validate_values({"controller": controller})
    monkeypatch.setenv("POD_NAMESPACE", RELEASE_NAMESPACE)
    budget = str(controller.get("rolloutBudget", "6/1h"))
    windows = json.dumps(controller.get("rolloutWindows", []))
    flag = "--rollout-budget" if "rolloutBudget" in controller else "--rollout-windows"
    with pytest.raises(ValueError, match=flag):
        Settings(rollout_windows=windows, rollout_budget=budget)


@pytest.mark.parametrize(
    "controller",
    [
        {"rolloutBudget": "100/24h"},
        {"rolloutBudget": "1/1.5h"},
        {"rolloutBudget": "3/1h30m"},
        {"rolloutBudget": "2/30s"},
        {"rolloutWindows": [{**_WINDOW, "schedule": "*/15 9-17 1,15 JAN-MAR sun"}]},
        {"rolloutWindows": [{**_WINDOW, "schedule": " 0  9 * * 1-5 "}]},
        {"rolloutWindows": [{**_WINDOW, "duration": "1h30m", "timeZone": ""}]},
        {"rolloutWindows": [{**_WINDOW, "duration": ".5h", "timeZone": "America/Argentina/Salta"}]},
        {"rolloutWindows": [{**_WINDOW, "timeZone": "Etc/GMT+1", "description": ""}]},
    ],
)
def test_the_schema_accepts_what_configpin_reads(
    controller: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    validate_values({"controller": controller})
    monkeypatch.setenv("POD_NAMESPACE", RELEASE_NAMESPACE)
    _serve_settings(render({"controller": controller}))


def test_what_only_configpin_can_refuse_stops_it_at_start_naming_the_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A schema cannot say everything (a time zone the tz database lacks, minute 61, a period
    under a second): such a value passes `helm install` and configpin refuses it at start,
    with a message that names the flag."""
    monkeypatch.setenv("POD_NAMESPACE", RELEASE_NAMESPACE)
    for controller, flag in [
        ({"rolloutWindows": [{**_WINDOW, "timeZone": "Europe/Atlantis"}]}, "--rollout-windows"),
        ({"rolloutWindows": [{**_WINDOW, "schedule": "61 9 * * *"}]}, "--rollout-windows"),
        ({"rolloutWindows": [{**_WINDOW, "duration": "0h"}]}, "--rollout-windows"),
        ({"rolloutBudget": "6/500ms"}, "--rollout-budget"),
    ]:
        validate_values({"controller": controller})
        with pytest.raises(ValueError, match=flag):
            _serve_settings(render({"controller": controller}))


def test_cluster_role_explains_cluster_wide_snapshot_writes() -> None:
    why = comment_before("rbac.yaml", '["create", "delete", "patch"]')
    assert "cluster-wide" in why
    assert "configpin.io/enabled" in why


def test_namespaced_role_is_scoped_by_resource_names(
    default: list[Manifest], custom: list[Manifest]
) -> None:
    given = flags(default)
    digest, cert, lease = (
        given["--digest-key-secret"],
        given["--cert-secret"],
        given["--lease-name"],
    )
    assert one(default, "Role")["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert rbac_grants(one(default, "Role")) == {
        ("", "secrets", "create", ()),
        ("", "secrets", "get", (digest, cert)),
        ("", "secrets", "update", (digest, cert)),
        ("coordination.k8s.io", "leases", "create", ()),
        ("coordination.k8s.io", "leases", "get", (lease,)),
        ("coordination.k8s.io", "leases", "update", (lease,)),
    }
    # cert-manager writes the certificate Secret; configpin only reads it from its mount.
    custom_digest = flags(custom)["--digest-key-secret"]
    assert ("", "secrets", "update", (custom_digest,)) in rbac_grants(one(custom, "Role"))


# --- MutatingWebhookConfiguration ----------------------------------------------------------


def test_webhook_fields(default: list[Manifest], custom: list[Manifest]) -> None:
    webhooks = one(default, "MutatingWebhookConfiguration")["webhooks"]
    assert [w["name"] for w in webhooks] == ["mutate.configpin.io", "sources.configpin.io"]
    hook = webhooks[0]
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "NoneOnDryRun"
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["timeoutSeconds"] == 5
    assert hook["failurePolicy"] == "Ignore"
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert one(custom, "MutatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Fail"
    service = one(default, "Service")
    assert hook["clientConfig"]["service"] == {
        "name": service["metadata"]["name"],
        "namespace": RELEASE_NAMESPACE,
        "path": "/mutate",
        "port": service["spec"]["ports"][0]["port"],
    }


def test_the_source_writes_webhook_previews_and_never_stands_in_the_way(
    default: list[Manifest], custom: list[Manifest]
) -> None:
    """ConfigMaps and Secrets: updates and deletions only, dry runs reach it (sideEffects
    None), Ignore whatever the workloads' policy, the same namespaces and no copies; off with
    webhook.sourceWrites=false."""
    workloads, sources = one(default, "MutatingWebhookConfiguration")["webhooks"]
    assert sources["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": SOURCE_RESOURCES,
            "operations": ["UPDATE", "DELETE"],
            "scope": "Namespaced",
        }
    ]
    assert sources["sideEffects"] == "None" and sources["failurePolicy"] == "Ignore"
    assert sources["namespaceSelector"] == workloads["namespaceSelector"]
    assert sources["objectSelector"] == workloads["objectSelector"]
    # the same Service, at its own path and handler
    assert sources["clientConfig"]["service"] == {
        **workloads["clientConfig"]["service"],
        "path": "/sources",
    }
    names = [c["name"] for c in sources["matchConditions"]]
    assert names == ["not-a-helm-release-or-a-token", "not-a-leader-election-record", "not-ignored"]
    [custom_sources] = one(custom, "MutatingWebhookConfiguration")["webhooks"][1:]
    assert custom_sources["failurePolicy"] == "Ignore"  # whatever webhook.failurePolicy says
    off = one(render({"webhook": {"sourceWrites": False}}), "MutatingWebhookConfiguration")
    assert [w["name"] for w in off["webhooks"]] == ["mutate.configpin.io"]


def test_each_entry_posts_to_its_own_handler(default: list[Manifest]) -> None:
    """The chart's entries and configpin's handlers name the same paths: the workloads entry
    /mutate, the sources entry /sources, each one configpin serves."""
    webhooks = one(default, "MutatingWebhookConfiguration")["webhooks"]
    paths = {w["name"]: w["clientConfig"]["service"]["path"] for w in webhooks}
    assert paths == {"mutate.configpin.io": WORKLOADS_PATH, "sources.configpin.io": SOURCES_PATH}
    admitter = Admitter(hkey=b"k" * 32, sources=FileSources(b"k" * 32, []), metrics=Metrics())
    try:
        assert set(admitter.webhooks) == set(paths.values())
    finally:
        admitter.close()


def test_webhook_choices_are_explained() -> None:
    template = "mutatingwebhookconfiguration.yaml"
    assert "idempotent" in comment_before(template, "reinvocationPolicy:")
    assert "controller" in comment_before(template, "failurePolicy:")


def test_webhook_rules_cover_pods_and_workloads(
    objects: list[Manifest], request: pytest.FixtureRequest
) -> None:
    rules = one(objects, "MutatingWebhookConfiguration")["webhooks"][0]["rules"]
    covered = set()
    custom = {"default": ARGO, "custom": CLONESET}[request.node.callspec.params["objects"]]
    for rule in rules:
        assert rule["operations"] == ["CREATE", "UPDATE"]
        assert rule["scope"] == "Namespaced"
        assert "*" not in rule["apiVersions"]
        covered |= {
            (g, r, v)
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for v in rule["apiVersions"]
        }
    # every version each kind is served at (CronJobs: batch/v1 and, before 1.21, v1beta1)
    wanted = {(k.group, k.resource, v) for k in BUILTIN_KINDS if k.admitted for v in k.versions}
    assert wanted | {(custom[0], custom[2], custom[1])} <= covered
    assert {(g, r) for g, r, _ in covered} == WORKLOAD_RULES | {(custom[0], custom[2])}


def test_custom_kinds_one_value_for_flag_rules_and_rbac() -> None:
    entries = [
        "apps.kruise.io/v1alpha1/clonesets/CloneSet=spec.template",
        "example.com/v1beta2/widgets/Widget=spec.pod.template",
    ]
    objects = render({"workloadKinds": entries, "pinOwnedBy": ["Foo.example.com"]})
    assert flags(objects)["--workload-kinds"] == ",".join(entries)
    assert flags(objects)["--pin-owned-by"] == "Foo.example.com"
    widget = ("example.com", "v1beta2", "widgets")
    assert rbac_grants(cluster_role(objects)) == expected_cluster_grants(
        snapshots=False,
        webhook=one(objects, "MutatingWebhookConfiguration")["metadata"]["name"],
        custom=[ARGO, CLONESET, widget],
    )
    rules = one(objects, "MutatingWebhookConfiguration")["webhooks"][0]["rules"]
    assert {
        "apiGroups": ["example.com"],
        "apiVersions": ["v1beta2"],
        "resources": ["widgets"],
        "operations": ["CREATE", "UPDATE"],
        "scope": "Namespaced",
    } in rules
    # what serve would refuse at start, the chart refuses first
    for bad in ("clonesets/CloneSet", "apps.kruise.io/v1alpha1/clonesets/CloneSet=spec[0]"):
        with pytest.raises(helm.HelmValuesError, match="workloadKinds"):
            render({"workloadKinds": [bad]})
    with pytest.raises(helm.HelmValuesError, match="pinOwnedBy"):
        render({"pinOwnedBy": ["deployments.apps"]})


@pytest.mark.parametrize("release_namespace", ["configpin-system", "platform"])
def test_namespace_selector_opt_in_only(release_namespace: str) -> None:
    objects = render({"webhook": {"excludeNamespaces": ["legacy"]}}, namespace=release_namespace)
    selector = one(objects, "MutatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"]
    assert selector["matchLabels"] == {"configpin.io/enabled": "true"}
    assert selects(selector, namespace_labels("team-a", enabled=True))
    assert not selects(selector, namespace_labels("team-b", enabled=False))
    for never in ("kube-system", release_namespace, "legacy"):
        assert not selects(selector, namespace_labels(never, enabled=True)), never
    exclusion = next(
        e for e in selector["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"
    )
    assert exclusion["operator"] == "NotIn"
    assert {"kube-system", release_namespace} <= set(exclusion["values"])


def test_object_selector_skips_configpins_own_objects(objects: list[Manifest]) -> None:
    selector = one(objects, "MutatingWebhookConfiguration")["webhooks"][0]["objectSelector"]
    assert not selects(selector, {"configpin.io/snapshot": "true", "app": "x"})
    assert selects(selector, {"app": "x"})
    assert selects(selector, {})


@pytest.mark.parametrize(
    ("kube_version", "values", "expected"),
    [
        ("1.20.2", {}, False),
        ("1.27.9", {}, False),
        ("1.28.0", {}, True),
        ("1.36.2", {}, True),
        ("1.36.2", {"webhook": {"matchConditions": False}}, False),
    ],
)
def test_match_conditions_by_capability(
    kube_version: str, values: dict[str, Any], expected: bool
) -> None:
    hook = one(render(values, kube_version), "MutatingWebhookConfiguration")["webhooks"][0]
    assert ("matchConditions" in hook) is expected
    if expected:
        [condition] = hook["matchConditions"]
        assert condition["name"] == "not-owned-by-a-controller"
        assert "ownerReferences" in condition["expression"]


# --- PodDisruptionBudget -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kube_version", "api_versions", "expected"),
    [
        ("1.20.2", ["policy/v1beta1", "policy/v1beta1/PodDisruptionBudget"], "policy/v1beta1"),
        ("1.20.2", [], "policy/v1beta1"),
        ("1.21.0", ["policy/v1", "policy/v1/PodDisruptionBudget"], "policy/v1"),
        ("1.25.0", ["policy/v1", "policy/v1/PodDisruptionBudget"], "policy/v1"),
        ("1.30.0", [], "policy/v1"),
    ],
)
def test_pdb_api_version_follows_capabilities(
    kube_version: str, api_versions: list[str], expected: str
) -> None:
    objects = render({}, kube_version, api_versions)
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["apiVersion"] == expected
    assert pdb["spec"]["minAvailable"] == 1
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selects(pdb["spec"]["selector"], pod_labels)


def test_pdb_only_with_spare_replicas() -> None:
    assert select(render({"replicaCount": 1}), "PodDisruptionBudget") == []
    assert one(render(NON_DEFAULT), "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    with pytest.raises(helm.HelmRenderError, match="minAvailable"):
        render({"podDisruptionBudget": {"minAvailable": 2}})


def test_names_follow_the_release() -> None:
    objects = render({}, release="edge")
    assert one(objects, "Deployment")["metadata"]["name"] == "edge-configpin"
    assert by_name(objects, "MutatingWebhookConfiguration", "edge-configpin")
    assert flags(objects)["--digest-key-secret"] == "edge-configpin-digest-key"


# --- container image -----------------------------------------------------------------------


def test_dockerfile_is_multi_stage_on_python_slim() -> None:
    build, runtime = dockerfile_stages()
    args = dict(a.split("=", 1) for i, a in dockerfile_instructions() if i == "ARG" and "=" in a)
    assert args["PYTHON_IMAGE"] == "python:3.11-slim"
    assert build[0] == ("FROM", "${PYTHON_IMAGE} AS builder")
    assert runtime[0] == ("FROM", "${PYTHON_IMAGE}")


def test_dockerfile_runtime_stage() -> None:
    runtime = dockerfile_stages()[-1]
    users = [a for i, a in runtime if i == "USER"]
    assert users == ["65532:65532"]
    entrypoint = [json.loads(a) for i, a in runtime if i == "ENTRYPOINT"]
    cmd = [json.loads(a) for i, a in runtime if i == "CMD"]
    assert entrypoint == [["configpin"]]
    assert cmd == [["serve"]]
    copies = [a for i, a in runtime if i == "COPY"]
    # Only the venv from the builder: no sources, no certificates, no build tools.
    assert copies == ["--from=builder /opt/configpin /opt/configpin"]


def test_dockerfile_installs_from_the_lock_with_hashes() -> None:
    build = dockerfile_stages()[0]
    runs = [a for i, a in build if i == "RUN"]
    lock_installs = [r for r in runs if "requirements.lock" in r]
    assert len(lock_installs) == 1
    words = shlex.split(lock_installs[0])
    assert "--require-hashes" in words
    assert "--no-deps" in words
    assert ("COPY", "requirements.lock /src/requirements.lock") in build
    # The project itself is built as a wheel and installed without resolving anything.
    wheel = next(r for r in runs if " wheel " in r)
    assert "--no-deps" in wheel
    assert "--no-index" in wheel
    for instruction, args in build:
        if instruction == "COPY":
            assert "certs" not in args
            assert "tests" not in args


def test_dockerignore_keeps_secrets_and_clutter_out() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"
    for excluded in ("certs/", ".venv/", "tests/", ".git/"):
        assert excluded in patterns
    allowed = {p[1:] for p in patterns if p.startswith("!")}
    assert allowed == {
        "pyproject.toml",
        "setup.py",
        "README.md",
        "requirements.lock",
        "requirements-build.lock",
        "webhook/",
    }


def locked(lock: str = "requirements.lock") -> dict[str, Requirement]:
    """The lock's requirements by canonical name (each `name==version ; marker`)."""
    text = (ROOT / lock).read_text()
    logical = re.sub(r"\\\n", " ", text)
    found: dict[str, Requirement] = {}
    for line in logical.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        spec, *hashes = re.split(r"\s+--hash=", line)
        assert hashes, f"no hashes: {spec}"
        assert all(h.startswith("sha256:") for h in hashes)
        requirement = Requirement(spec)
        assert len(requirement.specifier) == 1
        assert next(iter(requirement.specifier)).operator == "=="
        found[canonicalize_name(requirement.name)] = requirement
    return found


def test_lock_pins_every_runtime_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lock = locked()
    for dependency in project["dependencies"]:
        requirement = Requirement(dependency)
        name = canonicalize_name(requirement.name)
        assert name in lock, f"{name} is not in requirements.lock: re-lock"
        version = next(iter(lock[name].specifier)).version
        assert requirement.specifier.contains(version), (name, version)
    dev_only = {"pytest", "hypothesis", "ruff", "mypy", "helm-python-sdk", "import-linter"}
    assert not dev_only & set(lock)


def test_the_image_builds_with_the_build_requirements_pinned() -> None:
    """The image's build venv (requirements-build.lock) holds what pyproject's build-system
    asks for, its orjson (the types mypyc checks against) is the runtime's, and the image's
    wheel is compiled or not built at all."""
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    build = locked("requirements-build.lock")
    for spec in requires:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in build, f"{name} is not in requirements-build.lock: re-lock it"
        assert requirement.specifier.contains(next(iter(build[name].specifier)).version), name
    assert str(build["orjson"].specifier) == str(locked()["orjson"].specifier)
    runs = [a for i, a in dockerfile_stages()[0] if i == "RUN"]
    assert any("requirements-build.lock" in r and "--require-hashes" in r for r in runs)
    wheel = next(r for r in runs if " wheel " in r)
    assert wheel.startswith("CONFIGPIN_COMPILE=1 ")
    assert ("COPY", "pyproject.toml setup.py README.md /src/") in dockerfile_stages()[0]


def test_tests_run_what_the_image_runs() -> None:
    """The test environment has exactly the locked runtime versions installed."""
    mismatched = {}
    for name, requirement in locked().items():
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        wanted = next(iter(requirement.specifier)).version
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != wanted:
            mismatched[name] = (wanted, installed)
    assert not mismatched, f"(locked, installed) differ, re-lock or reinstall: {mismatched}"


# --- monitoring ----------------------------------------------------------------------------

MONITORING = {
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    }
}


def _registered_metrics() -> set[str]:
    from webhook.process.metrics import Metrics

    names = set()
    for family in Metrics().registry.collect():
        names.add(family.name)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        if family.type == "histogram":
            names |= {f"{family.name}_{suffix}" for suffix in ("bucket", "count", "sum")}
    return names


def test_monitoring_objects_only_when_asked() -> None:
    kinds = {o["kind"] for o in render({})}
    assert not {"ServiceMonitor", "PrometheusRule"} & kinds
    objects = render(MONITORING)
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service")
    assert selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"]["key"] == "ca.crt"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    dashboard = next(
        o for o in select(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")
    )
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["configpin.json"])["uid"] == "configpin"
    report = lint(MONITORING)
    assert not [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"], report["errors"]


def test_alerts_and_dashboard_name_only_metrics_configpin_serves() -> None:
    """A renamed metric would leave an alert that never fires: every configpin_* name the
    rules and the dashboard use is one that webhook/process/metrics.py registers."""
    objects = render(MONITORING)
    rules = one(objects, "PrometheusRule")["spec"]["groups"][0]["rules"]
    exprs = [r["expr"] for r in rules]
    dashboard = next(
        o for o in select(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")
    )
    panels = json.loads(dashboard["data"]["configpin.json"])["panels"]
    exprs += [t["expr"] for p in panels for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"configpin_[a-z_]+", e)}
    assert used, "no configpin metric used"
    missing = used - _registered_metrics()
    assert not missing, f"not served by configpin: {sorted(missing)}"
    names = {r["alert"] for r in rules}
    assert {"ConfigpinDown", "ConfigpinNoLeader", "ConfigpinAdmissionErrors"} <= names
    no_leader = render({**MONITORING, "controller": {"leaderElect": False}})
    rules = one(no_leader, "PrometheusRule")["spec"]["groups"][0]["rules"]
    assert "ConfigpinNoLeader" not in {r["alert"] for r in rules}


def test_the_stale_alert_fires_past_a_threshold_from_the_values() -> None:
    """ConfigpinWorkloadsStale: the longest-stale workload past metrics.prometheusRule.
    staleMinutes; a threshold within the minimum interval between rollouts is refused (a
    workload is stale that long by design)."""
    rules = one(render(MONITORING), "PrometheusRule")["spec"]["groups"][0]["rules"]
    stale = next(r for r in rules if r["alert"] == "ConfigpinWorkloadsStale")
    assert stale["expr"].startswith("max(configpin_workload_stale_seconds_max{")
    assert stale["expr"].endswith("}) > 900")
    assert "ConfigpinRolloutsFailing" in {r["alert"] for r in rules}
    custom = {
        "metrics": {
            **MONITORING["metrics"],
            "prometheusRule": {"enabled": True, "staleMinutes": 45},
        }
    }
    rules = one(render(custom), "PrometheusRule")["spec"]["groups"][0]["rules"]
    assert next(r for r in rules if r["alert"] == "ConfigpinWorkloadsStale")["expr"].endswith(
        "> 2700"
    )
    too_soon = {**custom, "controller": {"minRolloutIntervalSeconds": 3600}}
    with pytest.raises(helm.HelmRenderError, match="staleMinutes"):
        render(too_soon)


def test_the_flapping_alert_fires_while_a_budget_holds_a_workload() -> None:
    """ConfigpinRolloutsFlapping: a workload held by its rollout budget (issue 40) is no stale
    workload (ConfigpinWorkloadsStale leaves it out and says so); its own alert says what it
    means and what to do."""
    rules = one(render(MONITORING), "PrometheusRule")["spec"]["groups"][0]["rules"]
    flapping = next(r for r in rules if r["alert"] == "ConfigpinRolloutsFlapping")
    assert flapping["expr"] == (
        f'max(configpin_rollouts_held{{job="configpin", namespace="{RELEASE_NAMESPACE}", '
        'reason="budget"}) > 0'
    )
    assert flapping["for"] == "10m"
    assert flapping["labels"] == {"severity": "warning"}
    said = " ".join(flapping["annotations"]["description"].split())
    for what in (
        "{{ $value }}",
        "keeps changing",
        "--rollout-budget",
        "configpin.io/rollout-budget",
        "kubectl configpin status -A",
        "ConfigRolloutFlapping",
        "kubectl configpin approve configmap/NAME -n NAMESPACE",
        "with --now, also outside its rollout windows",
    ):
        assert what in said, what
    stale = next(r for r in rules if r["alert"] == "ConfigpinWorkloadsStale")
    said = " ".join(stale["annotations"]["description"].split())
    assert "(awaiting-window) or its rollout budget (flapping) hold is not stale" in said


def test_server_limits_reach_the_flags(default: list[Manifest]) -> None:
    given = flags(default)
    assert given["--max-connections"] == "1000"
    assert given["--header-timeout"] == "5"
    assert given["--body-timeout"] == "10"
    assert "--tls-cipher-suites" not in given  # the server's default: ECDHE with AEAD only
    suites = ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]
    custom = flags(render({"server": {"tlsCipherSuites": suites, "maxConnections": 300}}))
    assert custom["--tls-cipher-suites"] == ",".join(suites)
    assert custom["--max-connections"] == "300"
    settings = Settings(tls_cipher_suites=custom["--tls-cipher-suites"])
    assert settings.server.cipher_suites == tuple(suites)


def test_the_policy_confines_every_write_configpin_is_granted() -> None:
    """The ValidatingAdmissionPolicy covers each resource configpin may patch, no more: the
    kinds it re-stamps (from the table), copies, and pods it refreshes."""
    vap = ["admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"]
    for values in ({"snapshots": {"enabled": True}}, {"controller": {"refreshPods": False}}):
        objects = render(values, "1.36.2", vap)
        [policy] = select(objects, "ValidatingAdmissionPolicy")
        confined = {
            (g, r)
            for rule in policy["spec"]["matchConstraints"]["resourceRules"]
            if "UPDATE" in rule["operations"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
        }
        patched = {
            (g, r)
            for g, r, verb, names in rbac_grants(cluster_role(objects))
            if verb == "patch" and not names and g != "events.k8s.io"
        }
        assert confined == patched | SOURCES
        assert WORKLOAD_PATCHES | {(ARGO[0], ARGO[2])} <= confined


def test_the_policy_confines_custom_kinds_at_their_template_path() -> None:
    vap = ["admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"]
    values = {
        "snapshots": {"enabled": True},
        "workloadKinds": ["example.com/v1/widgets/Widget=spec.pod.template", CLONESET_ENTRY],
    }
    [policy] = select(render(values, "1.36.2", vap), "ValidatingAdmissionPolicy")
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    for group, version, resource in (ARGO, CLONESET, ("example.com", "v1", "widgets")):
        assert {
            "apiGroups": [group],
            "apiVersions": [version],
            "resources": [resource],
            "operations": ["UPDATE"],
        } in rules
    expressions = [v["expression"] for v in policy["spec"]["validations"]]
    widget = "(request.resource.group == 'example.com' && request.resource.resource == 'widgets')"
    # its own checks, at spec.pod.template; the spec.template checks do not apply to it
    assert any(
        f"!({widget})" in e and "object.spec.pod.template.spec.containers" in e for e in expressions
    )
    assert all(
        f"!({widget}))" in e for e in expressions if "object.spec.template.spec.containers" in e
    )
