"""The chart where clusters differ (issue 46): OpenShift's assigned IDs, hostNetwork and its
port, the opt-in label and namespace scope as values (one source for the webhook and the
server), a PodMonitor and relabelings, the failed-rollout alert, `helm test`, commonLabels and
commonAnnotations, Artifact Hub's metadata. Rendered and linted with Helm's own library."""

from __future__ import annotations

import http.server
import json
import re
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import helm_python as helm
import pytest
import yaml

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
from tests.unit.project.test_chart import (
    _registered_metrics,
    _serve_settings,
    container,
    flags,
    restricted_violations,
    selects,
)
from webhook.tls.certgen import generate

OPENSHIFT = ["security.openshift.io/v1", "security.openshift.io/v1/SecurityContextConstraints"]
VAP = ["admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"]
IDS = ("runAsUser", "runAsGroup", "fsGroup")
# Every optional object on, so that "every object" means every kind the chart can make.
EVERYTHING: dict[str, Any] = {
    "certManager": {"enabled": True},
    "networkPolicy": {"enabled": True, "from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}]},
    "metrics": {
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    },
    "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/cp"}},
}


def _clean_lint(values: Mapping[str, Any], kube_version: str = "1.30.0") -> None:
    report = lint(values, kube_version)
    assert not [m for m in report["messages"] if m["severity"] >= 2], report["messages"]
    assert not report["errors"], report["errors"]


def _pod_spec(objects: list[Manifest]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objects, "Deployment")["spec"]["template"]["spec"]
    return spec


def _test_pod(values: Mapping[str, Any] | None = None, **kwargs: Any) -> Manifest:
    [pod] = render(values, tests=True, **kwargs)
    return pod


# --- commonLabels and commonAnnotations -------------------------------------------------------


def test_common_labels_and_annotations_reach_every_object() -> None:
    values = {
        **EVERYTHING,
        "commonLabels": {"team": "platform", "app.kubernetes.io/name": "not-this"},
        "commonAnnotations": {
            "owner": "platform@example.com",
            "eks.amazonaws.com/role-arn": "replaced by the object's own",
        },
    }
    objects = render(values, api_versions=VAP) + render(values, tests=True)
    kinds = {o["kind"] for o in objects}
    assert {"Certificate", "Issuer", "NetworkPolicy", "ServiceMonitor", "PrometheusRule"} <= kinds
    assert {"ConfigMap", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds
    assert "Pod" in kinds  # the helm test
    for obj in objects:
        meta = obj["metadata"]
        where = f"{obj['kind']}/{meta['name']}"
        assert meta["labels"]["team"] == "platform", where
        assert meta["labels"]["app.kubernetes.io/name"] != "not-this", where  # never replaced
        assert meta["annotations"]["owner"] == "platform@example.com", where
    account = one(objects, "ServiceAccount")["metadata"]["annotations"]
    assert account["eks.amazonaws.com/role-arn"] == "arn:aws:iam::1:role/cp"
    webhook = one(objects, "MutatingWebhookConfiguration")["metadata"]["annotations"]
    assert webhook["cert-manager.io/inject-ca-from"] == f"{RELEASE_NAMESPACE}/configpin"
    # the pods carry the labels too, the selector stays the chart's
    deployment = one(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["team"] == "platform"
    assert pod_labels["app.kubernetes.io/name"] == "configpin"
    assert deployment["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "configpin",
        "app.kubernetes.io/instance": "configpin",
    }
    assert "annotations" not in deployment["spec"]["template"]["metadata"]
    _clean_lint(values)
    # without them, no object gains an annotations field
    for obj in render({"commonLabels": {}, "commonAnnotations": {}}):
        assert "annotations" not in obj["metadata"], obj["kind"]


def test_an_objects_own_labels_beat_common_labels_but_not_the_charts() -> None:
    values = {
        "commonLabels": {"release": "common", "team": "platform"},
        "metrics": {
            "serviceMonitor": {
                "enabled": True,
                "labels": {"release": "prom", "app.kubernetes.io/instance": "no"},
            }
        },
    }
    labels = one(render(values), "ServiceMonitor")["metadata"]["labels"]
    assert labels["release"] == "prom"
    assert labels["team"] == "platform"
    assert labels["app.kubernetes.io/instance"] == "configpin"


def test_the_schema_refuses_labels_the_api_server_would() -> None:
    validate_values({"commonLabels": {"example.com/team": "a.b-c_d", "empty": ""}})
    for bad in ({"commonLabels": {"team": "a b"}}, {"commonLabels": {"-x": "a"}}):
        with pytest.raises(helm.HelmValuesError):
            validate_values(bad)


# --- who the pods run as: OpenShift's SCCs ----------------------------------------------------


def _ids(spec: Mapping[str, Any]) -> dict[str, Any]:
    pod = {k: spec["securityContext"].get(k) for k in IDS}
    for c in spec["containers"]:
        pod |= {f"{c['name']}.{k}": c["securityContext"].get(k) for k in IDS[:2]}
    return {k: v for k, v in pod.items() if v is not None}


def test_fixed_ids_by_default_off_openshift() -> None:
    for objects in (render({}), render({"runAsIds": "fixed"}, api_versions=OPENSHIFT)):
        assert _ids(_pod_spec(objects)) == {
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "fsGroup": 65532,
            "configpin.runAsUser": 65532,
            "configpin.runAsGroup": 65532,
        }


@pytest.mark.parametrize(
    ("values", "api_versions"),
    [({"runAsIds": "assigned"}, []), ({}, OPENSHIFT), ({"runAsIds": "auto"}, OPENSHIFT)],
    ids=["assigned", "auto-on-openshift", "auto-explicit"],
)
def test_assigned_ids_leave_uid_gid_and_fsgroup_to_the_scc(
    values: dict[str, Any], api_versions: list[str]
) -> None:
    """OpenShift's restricted-v2 SCC assigns a UID from the namespace's range, GID 0 and an
    fsGroup, and refuses a pod that names others: none is set, the rest of "restricted" stays."""
    objects = render(values, api_versions=api_versions)
    spec = _pod_spec(objects)
    assert _ids(spec) == {}
    assert [p for p in restricted_violations(spec) if "runAsUser" not in p] == []
    pod_sc, sc = spec["securityContext"], container(objects)["securityContext"]
    assert pod_sc == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert sc == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # the helm test's Pod runs as the SCC says too
    test_spec = _test_pod(values, api_versions=api_versions)["spec"]
    assert _ids(test_spec) == {}
    _clean_lint(values)


def test_security_context_overrides_go_over_the_charts() -> None:
    values = {
        "runAsIds": "assigned",
        "podSecurityContext": {"supplementalGroups": [1000], "fsGroup": 2000},
        "securityContext": {"runAsUser": 1000680000, "seLinuxOptions": {"level": "s0:c26,c5"}},
    }
    objects = render(values)
    spec = _pod_spec(objects)
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
        "supplementalGroups": [1000],
        "fsGroup": 2000,
    }
    sc = container(objects)["securityContext"]
    assert sc["runAsUser"] == 1000680000
    assert sc["seLinuxOptions"] == {"level": "s0:c26,c5"}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert restricted_violations(spec) == []
    # over fixed IDs, what is given wins
    fixed = _pod_spec(render({"podSecurityContext": {"runAsUser": 1001}}))
    assert fixed["securityContext"]["runAsUser"] == 1001
    assert fixed["securityContext"]["fsGroup"] == 65532
    _clean_lint(values)


@pytest.mark.parametrize(
    "values",
    [
        {"runAsIds": "random"},
        {"runAsIds": True},
        {"securityContext": {"privileged": "no"}},
        {"securityContext": {"capabilities": {"keep": ["ALL"]}}},
        {"podSecurityContext": {"runAsUser": -1}},
    ],
)
def test_the_schema_refuses_bad_security_values(values: dict[str, Any]) -> None:
    validate_values({"runAsIds": "assigned", "securityContext": {"runAsUser": 1000680000}})
    with pytest.raises(helm.HelmValuesError):
        validate_values(values)


# --- hostNetwork --------------------------------------------------------------------------


def _named_port(c: Mapping[str, Any], name: str) -> int:
    port: int = next(p["containerPort"] for p in c["ports"] if p["name"] == name)
    return port


def test_host_network_moves_everything_to_its_own_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", RELEASE_NAMESPACE)
    values = {"hostNetwork": {"enabled": True, "port": 10443}, "networkPolicy": {"enabled": True}}
    objects = render(values)
    spec = _pod_spec(objects)
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    c = container(objects)
    assert c["ports"] == [{"name": "https", "containerPort": 10443, "protocol": "TCP"}]
    assert flags(objects)["--port"] == "10443"
    assert _serve_settings(objects).server.port == 10443
    # the Service, the probes and the NetworkPolicy name the port, which is 10443 now
    [service_port] = one(objects, "Service")["spec"]["ports"]
    assert service_port["port"] == 443
    assert _named_port(c, service_port["targetPort"]) == 10443
    for probe in ("readinessProbe", "livenessProbe"):
        assert _named_port(c, c[probe]["httpGet"]["port"]) == 10443
    assert one(objects, "NetworkPolicy")["spec"]["ingress"] == []  # no peers: none may connect
    policy = render({**values, "networkPolicy": {"enabled": True, "from": [{"podSelector": {}}]}})
    assert one(policy, "NetworkPolicy")["spec"]["ingress"][0]["ports"] == [
        {"port": 10443, "protocol": "TCP"}
    ]
    # one replica per node holds the port: an update replaces them one at a time
    strategy = one(objects, "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert strategy == {"maxUnavailable": 1, "maxSurge": 0}
    _clean_lint(values)
    _clean_lint(values, "1.20.2")


def test_without_host_network_the_pod_keeps_its_own_network_on_8443() -> None:
    objects = render({"hostNetwork": {"enabled": False, "port": 10443}})
    spec = _pod_spec(objects)
    assert "hostNetwork" not in spec and "dnsPolicy" not in spec
    assert _named_port(container(objects), "https") == 8443
    assert flags(objects)["--port"] == "8443"
    strategy = one(objects, "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert strategy == {"maxUnavailable": 0, "maxSurge": 1}


@pytest.mark.parametrize("port", [80, 10250, 70000, "10443"])
def test_the_schema_refuses_a_host_port_configpin_cannot_have(port: Any) -> None:
    validate_values({"hostNetwork": {"enabled": True, "port": 10443}})
    with pytest.raises(helm.HelmValuesError):
        validate_values({"hostNetwork": {"enabled": True, "port": port}})


# --- where configpin acts: one selector for the webhook and the server ------------------------


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for ch in selector:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += ch
    return [*terms, current.strip()] if current.strip() else terms


def string_selects(selector: str, labels: Mapping[str, str]) -> bool:
    """A label selector string, as the API server reads --namespace-selector's value."""
    for term in _split_terms(selector):
        if m := re.fullmatch(r"(\S+) (in|notin) \(([^)]*)\)", term):
            key, op, values = m[1], m[2], {v.strip() for v in m[3].split(",")}
            ok = (labels.get(key) in values) if op == "in" else (labels.get(key) not in values)
        elif m := re.fullmatch(r"([^=!]+)(==|=|!=)(.*)", term):
            equal = labels.get(m[1]) == m[3]
            ok = equal if m[2] != "!=" else not equal
        elif term.startswith("!"):
            ok = term[1:] not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True


def _namespaces() -> list[dict[str, str]]:
    """Label sets of namespaces, every combination that the selectors below can tell apart."""
    found = []
    for name in ("team-a", "kube-system", RELEASE_NAMESPACE, "legacy"):
        for opted in ({}, {"configpin.io/enabled": "true"}, {"example.com/pin": "yes"}):
            for tier in ({}, {"tier": "apps"}, {"tier": "system"}):
                for frozen in ({}, {"frozen": ""}):
                    found.append({"kubernetes.io/metadata.name": name, **opted, **tier, **frozen})
    return found


SCOPES = [
    {},
    {"webhook": {"excludeNamespaces": ["legacy"]}},
    {"webhook": {"optInLabel": {"key": "example.com/pin", "value": "yes"}}},
    {"webhook": {"optInLabel": {"key": "", "value": ""}}},
    {
        "webhook": {
            "namespaceSelector": {
                "matchLabels": {"tier": "apps"},
                "matchExpressions": [{"key": "frozen", "operator": "DoesNotExist"}],
            },
            "excludeNamespaces": ["legacy"],
        }
    },
    {
        "webhook": {
            "optInLabel": {"key": "", "value": ""},
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": "tier", "operator": "NotIn", "values": ["system"]},
                    {"key": "tier", "operator": "In", "values": ["apps", "web"]},
                    {"key": "frozen", "operator": "Exists"},
                ]
            },
        }
    },
]


@pytest.mark.parametrize("values", SCOPES, ids=lambda v: json.dumps(v, sort_keys=True)[:60])
def test_the_webhook_and_the_server_select_the_same_namespaces(values: dict[str, Any]) -> None:
    objects = render(values)
    hooks = one(objects, "MutatingWebhookConfiguration")["webhooks"]
    selector = hooks[0]["namespaceSelector"]
    assert all(h["namespaceSelector"] == selector for h in hooks)  # the source-writes entry too
    server = flags(objects)["--namespace-selector"] or ""
    chosen = []
    for labels in _namespaces():
        by_webhook = selects(selector, labels)
        assert by_webhook is string_selects(server, labels), (labels, selector, server)
        if by_webhook:
            chosen.append(labels)
    assert chosen, "selects no namespace at all"
    for labels in chosen:  # never kube-system or configpin's own, whatever the values
        assert labels["kubernetes.io/metadata.name"] not in ("kube-system", RELEASE_NAMESPACE)
    excluded = values.get("webhook", {}).get("excludeNamespaces", [])
    assert all(labels["kubernetes.io/metadata.name"] not in excluded for labels in chosen)
    assert ("--exclude-namespaces=legacy" in container(objects)["args"]) is bool(excluded)
    _clean_lint(values)


def test_the_opt_in_label_is_a_value() -> None:
    values = {"webhook": {"optInLabel": {"key": "example.com/pin", "value": "yes"}}}
    objects = render(values)
    selector = one(objects, "MutatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"]
    assert selector["matchLabels"] == {"example.com/pin": "yes"}
    assert flags(objects)["--namespace-selector"] == (
        f"example.com/pin=yes,kubernetes.io/metadata.name notin (kube-system,{RELEASE_NAMESPACE})"
    )
    assert "kubectl label namespace NAME example.com/pin=yes" in notes(values)
    assert "configpin.io/enabled" not in notes(values)
    anywhere = {"webhook": {"optInLabel": {"key": "", "value": ""}}}
    no_label = one(render(anywhere), "MutatingWebhookConfiguration")["webhooks"][0]
    assert "matchLabels" not in no_label["namespaceSelector"]
    assert "No opt-in label" in notes(anywhere)


@pytest.mark.parametrize(
    "values",
    [
        {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]}},
        {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
        {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}},
        {
            "namespaceSelector": {
                "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
            }
        },
        {"namespaceSelector": {"matchLabels": {"a": "not a value"}}},
        {"namespaceSelector": {"matchNames": ["a"]}},
        {"optInLabel": {"key": "example.com/pin", "value": True}},  # unquoted YAML true
        {"optInLabel": {"key": "bad key", "value": "x"}},
    ],
)
def test_the_schema_refuses_a_selector_the_api_server_would(values: dict[str, Any]) -> None:
    for good in SCOPES:
        validate_values(good)
    with pytest.raises(helm.HelmValuesError):
        validate_values({"webhook": values})


# --- monitoring: PodMonitor, relabelings, the failed-rollout alert ---------------------------

RELABEL = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]
DROP = [{"sourceLabels": ["__name__"], "regex": "go_.*", "action": "drop"}]


def test_a_pod_monitor_instead_of_the_service_monitor() -> None:
    values = {
        "metrics": {
            "podMonitor": {
                "enabled": True,
                "interval": "15s",
                "labels": {"release": "prom"},
                "relabelings": RELABEL,
                "metricRelabelings": DROP,
            },
            "prometheusRule": {"enabled": True},
        }
    }
    objects = render(values)
    assert select(objects, "ServiceMonitor") == []
    monitor = one(objects, "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    pod = one(objects, "Deployment")["spec"]["template"]
    assert selects(monitor["spec"]["selector"], pod["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [RELEASE_NAMESPACE]}
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == pod["spec"]["containers"][0]["ports"][0]["name"]
    assert (endpoint["path"], endpoint["scheme"], endpoint["interval"]) == (
        "/metrics",
        "https",
        "15s",
    )
    assert endpoint["tlsConfig"] == {
        "serverName": f"configpin.{RELEASE_NAMESPACE}.svc",
        "ca": {"secret": {"name": "configpin-tls", "key": "ca.crt"}},
    }
    assert endpoint["relabelings"] == RELABEL
    assert endpoint["metricRelabelings"] == DROP
    # the Prometheus Operator names a PodMonitor's job namespace/name: the alerts follow
    rules = one(objects, "PrometheusRule")["spec"]["groups"][0]["rules"]
    down = next(r for r in rules if r["alert"] == "ConfigpinDown")
    assert down["expr"] == (
        f'absent(up{{job="{RELEASE_NAMESPACE}/configpin", namespace="{RELEASE_NAMESPACE}"}} == 1)'
    )
    _clean_lint(values)


def test_service_monitor_relabelings() -> None:
    values = {
        "metrics": {
            "serviceMonitor": {
                "enabled": True,
                "relabelings": RELABEL,
                "metricRelabelings": DROP,
            }
        }
    }
    [endpoint] = one(render(values), "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["relabelings"] == RELABEL
    assert endpoint["metricRelabelings"] == DROP
    [plain] = one(render({"metrics": {"serviceMonitor": {"enabled": True}}}), "ServiceMonitor")[
        "spec"
    ]["endpoints"]
    assert "relabelings" not in plain and "metricRelabelings" not in plain
    _clean_lint(values)


def test_not_both_monitors() -> None:
    both = {"metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}}
    with pytest.raises(helm.HelmRenderError, match="choose one"):
        render(both)
    with pytest.raises(helm.HelmValuesError):
        validate_values({"metrics": {"podMonitor": {"relabelings": {"a": 1}}}})


def test_an_alert_on_failed_config_rollouts() -> None:
    """configpin_rollout_failures_total{action}: a rollout that failed and what configpin did
    about it; a person's own rollback is counted, not alerted on."""
    values = {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}}
    rules = one(render(values), "PrometheusRule")["spec"]["groups"][0]["rules"]
    failed = next(r for r in rules if r["alert"] == "ConfigpinConfigRolloutFailed")
    assert failed["expr"] == (
        "sum by (action) (increase(configpin_rollout_failures_total{"
        f'job="configpin", namespace="{RELEASE_NAMESPACE}", '
        'action!="rolled-back-by-person"}[1h])) > 0'
    )
    assert "configpin_rollout_failures_total" in _registered_metrics()
    from webhook.core.record import Action
    from webhook.process.metrics import Metrics

    counter = Metrics().rollout_failures
    assert counter._labelnames == ("action",)
    assert Action.PERSON.value == "rolled-back-by-person"
    assert failed["labels"] == {"severity": "warning"}
    said = " ".join(failed["annotations"]["description"].split())
    for what in ("{{ $labels.action }}", "ConfigRolledBack", "ConfigRolloutFailed", "status -A"):
        assert what in said, what


# --- helm test ---------------------------------------------------------------------------


def test_helm_test_is_a_hook_of_the_configpin_image_alone() -> None:
    assert all(o["kind"] != "Pod" for o in render({}))  # an install never creates it
    pod = _test_pod()
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert "hook-succeeded" in pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    spec = pod["spec"]
    [c] = spec["containers"]
    assert c["image"] == container(render({}))["image"] == "configpin:0.1.0"
    assert c["command"][:1] == ["python"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert restricted_violations(spec) == []
    # only the CA of the certificate Secret is mounted (never its keys)
    [volume] = spec["volumes"]
    assert volume["secret"] == {
        "secretName": "configpin-tls",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    # the webhook's ReplicaSet, Service and PDB must not take it for one of theirs
    objects = render({})
    for selector in (
        one(objects, "Deployment")["spec"]["selector"],
        {"matchLabels": one(objects, "Service")["spec"]["selector"]},
        one(objects, "PodDisruptionBudget")["spec"]["selector"],
    ):
        assert not selects(selector, pod["metadata"]["labels"])
    cert_manager = _test_pod({"certManager": {"enabled": True}, "image": {"tag": "9.9"}})
    assert cert_manager["spec"]["containers"][0]["image"] == "configpin:9.9"
    assert render({"tests": {"enabled": False}}, tests=True) == []
    _clean_lint({"tests": {"enabled": False}})


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An HTTPS server with a certificate of configpin's own kind for the Service's name,
    answering /readyz as `status` says."""
    folder = tmp_path_factory.mktemp("tls")
    bundle = generate("configpin", RELEASE_NAMESPACE)
    (folder / "ca.crt").write_bytes(bundle.ca_cert_pem)
    (folder / "tls.crt").write_bytes(bundle.cert_pem)
    (folder / "tls.key").write_bytes(bundle.key_pem)
    (folder / "other-ca.crt").write_bytes(generate("other", "elsewhere").ca_cert_pem)
    state: dict[str, Any] = {"status": 200, "folder": folder}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = state["status"] if self.path == "/readyz" else 404
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "tls.crt", folder / "tls.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["port"] = server.server_address[1]
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def _run_test_pod(serving: dict[str, Any], ca: str, values: Mapping[str, Any] | None = None) -> Any:
    """The test Pod's program run here, as its container would: the Service's ClusterIP in the
    variable the kubelet sets (127.0.0.1 here), the CA where the Pod mounts it (moved here)."""
    pod = _test_pod({"service": {"port": serving["port"]}, **(values or {})})
    [c] = pod["spec"]["containers"]
    program = c["command"][-1]
    assert '"/ca/ca.crt"' in program
    program = program.replace('"/ca/ca.crt"', json.dumps(str(serving["folder"] / ca)))
    env = {"CONFIGPIN_SERVICE_HOST": "127.0.0.1", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, *c["command"][1:-1], program],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_test_pod_passes_when_readyz_answers_200_with_a_certificate_of_the_ca(
    serving: dict[str, Any],
) -> None:
    serving["status"] = 200
    done = _run_test_pod(serving, "ca.crt")
    assert done.returncode == 0, done.stderr
    assert f"TLS to configpin.{RELEASE_NAMESPACE}.svc (127.0.0.1:" in done.stdout
    assert "GET /readyz: HTTP/1.0 200 OK" in done.stdout


def test_the_test_pod_fails_when_not_ready_or_another_ca_signed(serving: dict[str, Any]) -> None:
    serving["status"] = 503
    not_ready = _run_test_pod(serving, "ca.crt")
    assert not_ready.returncode == 1
    assert "503" in not_ready.stdout
    serving["status"] = 200
    stranger = _run_test_pod(serving, "other-ca.crt")
    assert stranger.returncode != 0
    assert "CERTIFICATE_VERIFY_FAILED" in stranger.stderr


def test_with_client_auth_the_test_pod_checks_the_handshake_only(serving: dict[str, Any]) -> None:
    serving["status"] = 503  # never asked
    done = _run_test_pod(serving, "ca.crt", {"clientAuth": {"caConfigMap": "apiserver-ca"}})
    assert done.returncode == 0, done.stderr
    assert "certificate verified" in done.stdout
    assert "GET /readyz" not in done.stdout


# --- Chart.yaml for Artifact Hub ----------------------------------------------------------

ARTIFACT_HUB_CHANGE_KINDS = {"added", "changed", "deprecated", "removed", "fixed", "security"}


def test_chart_metadata_for_artifact_hub() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.20.0-0"
    assert {"admission-webhook", "configmap", "secret", "rollout"} <= set(chart["keywords"])
    annotations = chart["annotations"]
    assert all(isinstance(v, str) for v in annotations.values())  # Helm wants strings
    assert annotations["artifacthub.io/license"] == "Apache-2.0"
    assert annotations["artifacthub.io/category"] == "integration-delivery"
    assert annotations["artifacthub.io/operator"] == "false"
    assert annotations["artifacthub.io/prerelease"] == "true"  # 0.x
    crds = yaml.safe_load(annotations["artifacthub.io/crds"])
    shipped = [yaml.safe_load(p.read_text()) for p in sorted((CHART_DIR / "crds").glob("*.yaml"))]
    assert [(c["kind"], c["name"], c["version"]) for c in crds] == [
        (
            crd["spec"]["names"]["kind"],
            crd["metadata"]["name"],
            crd["spec"]["versions"][0]["name"],
        )
        for crd in shipped
    ]
    changes = yaml.safe_load(annotations["artifacthub.io/changes"])
    assert changes and all(c["kind"] in ARTIFACT_HUB_CHANGE_KINDS for c in changes)
    assert all(c["description"] for c in changes)


def test_everything_at_once_renders_and_lints() -> None:
    values = {
        **EVERYTHING,
        "commonLabels": {"team": "platform"},
        "commonAnnotations": {"owner": "platform"},
        "runAsIds": "assigned",
        "securityContext": {"runAsUser": 1000680000},
        "hostNetwork": {"enabled": True, "port": 9443},
        "webhook": {"optInLabel": {"key": "example.com/pin", "value": "yes"}},
        "metrics": {"podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
    }
    for kube_version in ("1.20.2", "1.30.0"):
        _clean_lint(values, kube_version)
    objects = render(values, api_versions=OPENSHIFT)
    assert by_name(objects, "PodMonitor", "configpin")
    assert flags(objects)["--port"] == "9443"
