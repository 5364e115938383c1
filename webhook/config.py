"""Settings: each flag of `configpin serve` is also an environment variable CONFIGPIN_<NAME>."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

Mode = Literal["checksum", "snapshot", "off"]


def _own_namespace() -> str:
    # The downward API (POD_NAMESPACE) or the service account's namespace file, else "configpin".
    if ns := os.environ.get("POD_NAMESPACE"):
        return ns
    sa = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    try:
        return sa.read_text().strip() or "configpin"
    except OSError:
        return "configpin"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CONFIGPIN_", extra="forbid")

    host: str = Field("0.0.0.0", description="address to listen on")  # noqa: S104 (a server in a pod)
    port: int = Field(8443, ge=1, le=65535, description="HTTPS port")
    tls_cert: Path | None = Field(
        None, description="serving certificate (PEM); re-read when it changes"
    )
    tls_key: Path | None = Field(None, description="serving key (PEM)")
    certs_dir: Path = Field(
        Path("certs"), description="where dev certificates and the dev digest key go"
    )
    kubeconfig: Path | None = Field(
        None, description="kubeconfig file (else in-cluster, else KUBECONFIG)"
    )
    manifests: list[Path] = Field(
        default_factory=list, description="source manifests when no cluster"
    )
    mode: Mode = Field("checksum", description="default mode: checksum, snapshot or off")
    strict: bool = Field(
        False, description="deny instead of warn on missing sources and internal errors"
    )
    digest_key_file: Path | None = Field(None, description="file holding the HMAC digest key")
    digest_key_secret: str = Field(
        "configpin-digest-key", description="Secret holding the digest key"
    )
    namespace: str = Field(default_factory=_own_namespace, description="configpin's own namespace")
    shutdown_delay: float = Field(
        5.0, ge=0, description="seconds /readyz fails before the listener closes"
    )
    drain_timeout: float = Field(
        30.0, ge=0, description="seconds in-flight requests may take to finish"
    )
    log_level: str = Field("info", description="debug, info, warning or error")
    controller: bool = Field(True, description="run the change controller beside the webhook")
    leader_elect: bool = Field(True, description="elect one acting controller through a Lease")
    namespace_selector: str = Field(
        "configpin.io/enabled=true",
        description="label selector of the namespaces the controller acts in",
    )
    lease_name: str = Field("configpin-leader", description="the Lease used for leader election")
    lease_duration: float = Field(
        15.0, gt=0, description="seconds a leader holds the lease unrenewed"
    )
    coalesce_window: float = Field(
        2.0, ge=0, description="seconds changes to one workload's sources are folded"
    )
    min_rollout_interval: float = Field(
        30.0, ge=0, description="least seconds between two rollouts of a workload"
    )
    catch_up_window: float = Field(
        600.0, ge=0, description="seconds a never-stamped workload counts as admitted while down"
    )
    snapshot_grace_period: float = Field(
        600.0, ge=0, description="seconds an unused snapshot lives"
    )
    webhook_config_name: str = Field("configpin", description="its MutatingWebhookConfiguration")
    self_signed_certs: bool = Field(
        False, description="make and rotate its own CA and serving certificate"
    )
    cert_secret: str = Field("configpin-tls", description="Secret for self-managed certificates")
    service_name: str = Field(
        "configpin", description="its Service, for self-managed certificate names"
    )
