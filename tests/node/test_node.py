"""The node itself: it is Ready, runs pods that read their ConfigMaps, and Services reach pods
from pods and from the node's host, where the API server runs (a webhook Service is called
from there)."""

from __future__ import annotations

import sys

from kubernetes import client

from harness import images
from harness.apps import pod_log, reader_container, wait_ready, wait_seen
from harness.controlplane import wait_for
from harness.node import Node


def test_node_is_ready_at_its_bridge_address(node: Node, k8s: client.ApiClient) -> None:
    info = client.CoreV1Api(k8s).read_node(node.name)
    assert info.status.node_info.kubelet_version.startswith(f"v1.{node.minor}.")
    assert info.status.node_info.container_runtime_version.startswith("containerd://")
    addresses = {(a.type, a.address) for a in info.status.addresses}
    assert ("InternalIP", node.addresses.node_ip) in addresses
    assert {images.PAUSE.ref, images.SHELL.ref} <= set(node.images())
    # the `kubernetes` Service has the API server's advertised address as its endpoint
    endpoints = client.CoreV1Api(k8s).read_namespaced_endpoints("kubernetes", "default")
    assert [a.ip for s in endpoints.subsets for a in s.addresses] == [node.addresses.node_ip]


def test_pod_reads_configmap_from_volume_and_env(k8s: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s)
    core.create_namespaced_config_map(
        namespace,
        {"metadata": {"name": "app-config"}, "data": {"greeting": "hello-volume", "mood": "calm"}},
    )
    container = reader_container(
        images.SHELL.ref,
        files=["/config/greeting"],
        env=[
            {
                "name": "MOOD",
                "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "mood"}},
            }
        ],
        volume_mounts=[{"name": "config", "mountPath": "/config"}],
    )
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "reader"},
            "spec": {
                "containers": [container],
                "volumes": [{"name": "config", "configMap": {"name": "app-config"}}],
            },
        },
    )
    wait_ready(k8s, namespace, "reader")
    # the container's own log, fetched through the API server from the kubelet
    seen = wait_seen(k8s, namespace, "reader", {"env:MOOD": "calm"})
    assert seen.file("/config/greeting") == "hello-volume"
    assert seen.env("MOOD") == "calm"


def test_services_reach_pods_from_pods_and_from_the_node(
    node: Node, k8s: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(k8s)
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {
                "containers": [
                    {
                        "name": "httpd",
                        "image": images.SHELL.ref,
                        "imagePullPolicy": "Never",
                        "command": [
                            "sh",
                            "-c",
                            "mkdir -p /www && echo served-by-web > /www/index.html"
                            " && exec httpd -f -p 8080 -h /www",
                        ],
                        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                    }
                ]
            },
        },
    )
    service = core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    cluster_ip = service.spec.cluster_ip
    wait_ready(k8s, namespace, "web")
    api_ip = core.read_namespaced_service("kubernetes", "default").spec.cluster_ip

    # from a pod: the Service of another pod, and the API server through `kubernetes`
    script = (
        f"wget -q -O- http://{cluster_ip}/ && "
        f"nc -w 5 {api_ip} 443 </dev/null && echo api-server-reachable"
    )
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "client"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "client",
                        "image": images.SHELL.ref,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", script],
                    }
                ],
            },
        },
    )

    def finished() -> str | None:
        phase = core.read_namespaced_pod("client", namespace).status.phase
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for(finished, timeout=60, what="the client pod to finish")
    log = pod_log(k8s, namespace, "client")
    assert phase == "Succeeded", log
    assert log.split() == ["served-by-web", "api-server-reachable"]

    # from the node's host network namespace, as the API server calls a webhook's Service
    fetch = f"import urllib.request; print(urllib.request.urlopen('http://{cluster_ip}/').read())"
    assert node.host_run(sys.executable, "-c", fetch).stdout.strip() == "b'served-by-web\\n'"
