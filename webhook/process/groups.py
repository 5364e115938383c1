"""The settings of `configpin serve`, grouped by what they set (as kopf's `settings.posting`,
`settings.watching`): each field is one flag, `--` and its alias or name (`rollout_waves`:
`--rollout-waves`, read as `settings.rollout.waves`), and a text is parsed once, here, into what
the code uses."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PlainValidator,
    PrivateAttr,
    model_validator,
)

from webhook.core.budget import DEFAULT_BUDGET, Budget, parse_budget
from webhook.core.kinds import ARGO_ROLLOUT, WorkloadKind, parse_custom_kinds
from webhook.core.owners import parse_owner_kinds
from webhook.core.waves import WaveStep, parse_waves
from webhook.core.windows import Windows, parse_windows
from webhook.tls.ciphers import DEFAULT_CIPHER_SUITES, openssl_ciphers

Mode = Literal["checksum", "snapshot", "off"]
T = TypeVar("T")


def _own_namespace() -> str:
    # The downward API (POD_NAMESPACE) or the service account's namespace file, else "configpin".
    if ns := os.environ.get("POD_NAMESPACE"):
        return ns
    sa = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    try:
        return sa.read_text().strip() or "configpin"
    except OSError:
        return "configpin"


def _parsed(parse: Callable[[str], T], flag: str = "") -> PlainValidator:
    """A field given as text and kept as what `parse` makes of it; `flag` prefixes the error
    where `parse`'s own message does not name it."""

    def validate(value: Any) -> T:
        if not isinstance(value, str):
            raise ValueError(f"expected text, got {type(value).__name__}")
        try:
            return parse(value)
        except ValueError as e:
            if not flag:
                raise
            raise ValueError(f"{flag}: {e}") from None

    return PlainValidator(validate, json_schema_input_type=str)


def _as_text(default: str | None) -> Any:
    """The default of a parsed field, as the text a flag gives (so that --help and the docs
    show it, and it is parsed as a flag's is)."""
    return default


def _cipher_suites(value: str | None) -> tuple[str, ...]:
    """Comma-separated Kubernetes names; ValueError names an unknown one."""
    if value is None:
        return DEFAULT_CIPHER_SUITES
    if not isinstance(value, str):
        raise ValueError(f"expected text, got {type(value).__name__}")
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    openssl_ciphers(names)
    return names


class Group(BaseModel):
    """One group: its flags as fields, validated (and parsed) once, then frozen."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)
    title: ClassVar[str]  # its heading in --help and docs/settings.md


class Cluster(Group):
    """Which cluster configpin acts on, and in which of its namespaces."""

    title: ClassVar[str] = "Cluster and scope"

    kubeconfig: Path | None = Field(
        None,
        description=(
            "kubeconfig file of the cluster to act on. Without it configpin acts on a cluster "
            "only in a pod (in-cluster config); KUBECONFIG and ~/.kube/config are not read, and "
            "with no cluster the embedded default sources are served."
        ),
        json_schema_extra={"default_text": "in-cluster, else none (KUBECONFIG is not read)"},
    )
    manifests: list[Path] = Field(
        default_factory=list,
        description="Source manifests served when there is no cluster (repeatable).",
        json_schema_extra={"default_text": "embedded"},
    )
    namespace: str = Field(
        default_factory=_own_namespace,
        description="configpin's own namespace: its digest key, certificate and Lease live there.",
        json_schema_extra={
            "default_text": "POD_NAMESPACE, else the service account's, else configpin"
        },
    )
    namespace_selector: str = Field(
        "configpin.io/enabled=true",
        description=(
            "Label selector of the namespaces configpin acts in: admission enforces it too, "
            "whatever a review claims."
        ),
    )
    exclude_namespaces: list[str] = Field(
        default_factory=list,
        description=(
            "A namespace never acted in, whatever its labels, besides kube-system and "
            "--namespace (repeatable; the variable takes a JSON list)."
        ),
        json_schema_extra={"default_text": "none"},
    )

    @cached_property
    def excluded_namespaces(self) -> frozenset[str]:
        """Never acted in, whatever their labels: kube-system, configpin's own, and the list."""
        return frozenset({"kube-system", self.namespace, *self.exclude_namespaces})


class Admission(Group):
    """What admission does with a workload: its mode, the digest key, what a review may cost."""

    title: ClassVar[str] = "Admission"

    mode: Mode = Field(
        "checksum",
        description=(
            "Default mode: checksum (annotate the pod template with digests), snapshot (also pin "
            "each revision to an immutable copy of its ConfigMaps and Secrets) or off. A workload"
            " overrides it with the annotation configpin.io/mode."
        ),
    )
    strict: bool = Field(
        False,
        description=(
            "Deny the admission instead of admitting with a warning when a required source is "
            "missing, a source cannot be read or an internal error happens."
        ),
    )
    max_sources: int = Field(
        100,
        ge=1,
        description=(
            "Most distinct ConfigMaps/Secrets one object may consume and still be pinned; beyond"
            " it the object is admitted unpinned with a warning."
        ),
    )
    read_deadline: float = Field(
        3.0,
        gt=0,
        description=(
            "Seconds admission may spend reading sources past the cache; keep it below the "
            "webhook's timeoutSeconds (the chart passes timeoutSeconds - 2)."
        ),
    )
    read_workers: int = Field(
        4,
        ge=1,
        description=(
            "Threads that read sources past the cache; a review that would queue behind four "
            "times as many is answered at once, unchanged, with a warning."
        ),
    )
    digest_key_file: Path | None = Field(
        None,
        description="File holding the HMAC digest key (instead of the Secret).",
        json_schema_extra={"default_text": "none"},
    )
    digest_key_secret: str = Field(
        "configpin-digest-key",
        description=(
            "Secret in --namespace holding the HMAC digest key; made on first start when missing."
        ),
    )


class Snapshots(Group):
    """The immutable copies of snapshot mode, and when unused ones are deleted."""

    title: ClassVar[str] = "Snapshots"

    enabled: bool = Field(
        True,
        description=(
            "Allow snapshot mode, which writes ConfigMaps and Secrets (its copies). Off, a "
            "workload asking for it gets checksum mode and a warning, and configpin writes, "
            "adopts and sweeps no copy; --mode snapshot needs it on. The chart sets it from "
            "snapshots.enabled and mode."
        ),
        alias="snapshots",
    )
    grace_period: float = Field(
        600.0,
        ge=0,
        description=(
            "Snapshot copies that no revision uses any more are deleted after this many seconds."
        ),
        alias="snapshot_grace_period",
    )


class Workloads(Group):
    """Which kinds besides the built-in ones are pinned and rolled."""

    title: ClassVar[str] = "Workload kinds"

    configured_kinds: Annotated[tuple[WorkloadKind, ...], _parsed(parse_custom_kinds)] = Field(
        _as_text(""),
        description=(
            "Custom resources with a pod template that configpin pins and rolls like a "
            "Deployment, comma-separated group/version/resource/Kind=path (path: where the pod "
            "template is), e.g. apps.kruise.io/v1alpha1/clonesets/CloneSet=spec.template. A kind "
            "whose CRD is not served is left alone."
        ),
        json_schema_extra={"default_text": "none"},
        alias="workload_kinds",
    )
    argo_rollouts: bool = Field(
        True,
        description=(
            "Pin and roll Argo Rollouts (argoproj.io/v1alpha1 Rollout, spec.template) where its "
            "CRD is served; a Rollout with spec.workloadRef is pinned through its Deployment."
        ),
    )
    owner_kinds: Annotated[frozenset[tuple[str, str]], _parsed(parse_owner_kinds)] = Field(
        _as_text(""),
        description=(
            "Owner kinds whose workloads are pinned although a controller owns them, "
            "comma-separated Kind.group (e.g. Foo.example.com); any other owned workload is "
            "pinned only when annotated configpin.io/owned: pin."
        ),
        json_schema_extra={"default_text": "none"},
        alias="pin_owned_by",
    )

    @cached_property
    def custom_kinds(self) -> tuple[WorkloadKind, ...]:
        """The configured custom kinds, Argo Rollouts first when enabled (a configured
        Rollout entry replaces the built-in one)."""
        configured = self.configured_kinds
        argo = (ARGO_ROLLOUT,) if self.argo_rollouts else ()
        return (*(k for k in argo if all(c.kind != k.kind for c in configured)), *configured)


class Rollout(Group):
    """How a change to a source rolls out: waves, the cap, windows, the flap guard, pacing."""

    title: ClassVar[str] = "Rollouts"
    _budget_text: str = PrivateAttr(DEFAULT_BUDGET)

    waves: Annotated[tuple[WaveStep, ...] | None, _parsed(parse_waves)] = Field(
        _as_text("1,10%,100%"),
        description=(
            "A change consumed by several workloads rolls in waves: counts (1) and shares of "
            "the rest (10%), comma-separated; a wave starts when every rollout of the one "
            "before is complete, and a failure stops the waves after it; the waves after an "
            "approve step wait until the change is approved (1,approve,100%). off: all at once."
        ),
        alias="rollout_waves",
    )
    max_rolling: int = Field(
        50,
        ge=0,
        description=(
            "Config rollouts in flight at once in one namespace, at most (0: no cap); others "
            "there wait their turn. A tenant's rollouts never wait for another namespace's; "
            "a paused rollout, or one superseded by a newer change, holds no place."
        ),
    )
    windows: Annotated[Windows, _parsed(parse_windows, "--rollout-windows")] = Field(
        _as_text(""),
        description=(
            "When configpin may start a rollout, for the whole cluster: a JSON or YAML list of "
            "windows with the fields of Argo CD's sync windows, "
            '[{"kind": "deny", "schedule": "0 22 * * 5", "duration": "60h", '
            '"timeZone": "Europe/Berlin"}] (kind allow or deny; schedule a five-field cron '
            "expression for when it opens; duration as Go writes durations; timeZone an IANA "
            "name, default UTC). Where allow windows apply it rolls only inside one; a deny "
            "window wins. Combined with a namespace's and a workload's "
            "configpin.io/rollout-windows: each list must allow it. Empty: always."
        ),
        json_schema_extra={"default_text": "none"},
        alias="rollout_windows",
    )
    budget: Annotated[Budget, _parsed(parse_budget, "--rollout-budget")] = Field(
        _as_text(DEFAULT_BUDGET),
        description=(
            "The flap guard: at most COUNT rollouts configpin starts of one workload within "
            "PERIOD (a Go duration), e.g. 6/1h; past it the workload is held as flapping and "
            "rolls once, to the latest content, when the budget allows again or a person "
            "approves. 0: none. A workload's configpin.io/rollout-budget sets its own."
        ),
        alias="rollout_budget",
    )
    coalesce_window: float = Field(
        2.0,
        ge=0,
        description=(
            "Changes to sources arriving within this many seconds are rolled out together. A "
            "workload refreshed in place (on-change: refresh) is refreshed at the first "
            "change, and what follows within the window makes one more pass when it ends."
        ),
    )
    min_interval: float = Field(
        30.0,
        ge=0,
        description=(
            "A workload is rolled at most once per this many seconds, whatever changes arrive."
        ),
        alias="min_rollout_interval",
    )
    catch_up_window: float = Field(
        600.0,
        ge=0,
        description=(
            "A workload that carries no configpin annotations at all is stamped (and so rolled) "
            "only when younger than this many seconds: it was admitted while configpin was "
            "unreachable. Older ones get a baseline that restarts nothing."
        ),
    )
    refresh_pods: bool = Field(
        True,
        description=(
            "Honour configpin.io/on-change: refresh: patch one annotation on the running pods "
            "of such a workload (needs pods patch) instead of rolling it; off: they roll."
        ),
    )

    @model_validator(mode="wrap")
    @classmethod
    def _keep_budget_text(cls, data: Any, handler: ModelWrapValidatorHandler[Rollout]) -> Rollout:
        group = handler(data)
        if isinstance(data, dict) and isinstance(data.get("rollout_budget"), str):
            group._budget_text = data["rollout_budget"].strip()
        return group

    @property
    def budget_text(self) -> str:
        """The flap guard as --rollout-budget wrote it (status quotes it so)."""
        return self._budget_text


class Controller(Group):
    """The change controller: whether it runs, leader election, its pace against the API."""

    title: ClassVar[str] = "Controller"

    enabled: bool = Field(
        True,
        description="Run the change controller beside the webhook (needs a cluster).",
        alias="controller",
    )
    leader_elect: bool = Field(
        True,
        description="Elect one acting controller among the replicas through a coordination Lease.",
    )
    lease_name: str = Field(
        "configpin-leader", description="Name of the Lease used for leader election."
    )
    lease_duration: float = Field(
        15.0, gt=0, description="Seconds a leader holds the Lease without renewing it."
    )
    qps: float = Field(
        200.0,
        ge=0,
        description=(
            "Client-side rate limit of the controller's fan-out: requests per second (reads and "
            "writes of workloads being re-stamped), as client-go's QPS; 0: unlimited. Admission "
            "never waits on it."
        ),
        alias="controller_qps",
    )
    burst: int = Field(
        400,
        ge=1,
        description=(
            "Requests the controller may send at once above --controller-qps before the rate "
            "applies, as client-go's burst."
        ),
        alias="controller_burst",
    )
    resync_period: float = Field(
        300.0,
        ge=0,
        description=(
            "While leading, every workload is checked against the cluster's content this often, "
            "in seconds (0: never), besides on every change and relist: a missed event or a "
            "rollout given up after its retries is caught here."
        ),
    )


class Server(Group):
    """The HTTPS listener: address, TLS, timeouts, connections and shutdown."""

    title: ClassVar[str] = "Server"

    host: str = Field(
        "127.0.0.1",
        description=(
            "Address the HTTPS listener binds: loopback unless asked, so that a server started "
            "on a laptop is reachable from that machine only. The chart and the image bind "
            "0.0.0.0 (CONFIGPIN_HOST), where the API server reaches the pod."
        ),
    )
    port: int = Field(8443, ge=1, le=65535, description="HTTPS port (TLS 1.2 or newer only).")
    tls_cert: Path | None = Field(
        None,
        description=(
            "Serving certificate (PEM); re-read when the file changes (a mounted Secret's symlink"
            " swap), without a restart."
        ),
        json_schema_extra={"default_text": "dev certificates in --certs-dir"},
    )
    tls_key: Path | None = Field(
        None,
        description="Serving key (PEM).",
        json_schema_extra={"default_text": "dev key in --certs-dir"},
    )
    client_ca: Path | None = Field(
        None,
        description=(
            "CA (PEM) that callers' client certificates must be signed by: a caller without such"
            " a certificate cannot complete the TLS handshake (see docs/security.md)."
        ),
        json_schema_extra={"default_text": "none: any caller that reaches the port is answered"},
    )
    cipher_suites: Annotated[tuple[str, ...], PlainValidator(_cipher_suites)] = Field(
        _as_text(None),
        description=(
            "TLS 1.2 cipher suites, comma-separated Kubernetes names (as kube-apiserver's "
            "--tls-cipher-suites); TLS 1.3 suites are not configurable."
        ),
        json_schema_extra={"default_text": "ECDHE with AES-GCM or ChaCha20-Poly1305 only"},
        alias="tls_cipher_suites",
    )
    tls_handshake_timeout: float = Field(
        5.0, gt=0, description="Seconds a client has to complete the TLS handshake."
    )
    header_timeout: float = Field(
        5.0,
        gt=0,
        description=(
            "Seconds a client has for its request line and headers, from the TLS handshake or "
            "from its first byte after an idle spell; then the connection is closed."
        ),
    )
    body_timeout: float = Field(
        10.0,
        gt=0,
        description=(
            "Seconds a request body may take once its headers are in; then 408 and the "
            "connection is closed."
        ),
    )
    keep_alive_timeout: float = Field(
        120.0,
        gt=90,
        description=(
            "Seconds an idle connection is kept between requests; above the API server's 90 s, "
            "so that the client, never configpin, closes an idle connection."
        ),
    )
    max_connections: int = Field(
        1000,
        ge=1,
        description="Connections open at once; past it a new one is answered 503 and closed.",
    )
    max_header_bytes: int = Field(
        32 * 1024,
        ge=1024,
        description="Largest request line and headers, in bytes; a larger head is answered 431.",
    )
    shutdown_delay: float = Field(
        5.0,
        ge=0,
        description=(
            "On SIGTERM, configpin turns readiness off and keeps serving for this many seconds "
            "before the listener closes, so that the API server stops sending it requests first."
        ),
    )
    drain_timeout: float = Field(
        30.0,
        ge=0,
        description=(
            "Then in-flight requests get up to this many seconds to finish before configpin exits."
        ),
    )


class Certificates(Group):
    """Where the serving certificate comes from when --tls-cert is not given."""

    title: ClassVar[str] = "Certificates"

    dir: Path = Field(
        Path("certs"),
        description="Where dev certificates and the dev digest key are made.",
        alias="certs_dir",
    )
    self_signed: bool = Field(
        False,
        description="Make and rotate its own CA and serving certificate, kept in --cert-secret.",
        alias="self_signed_certs",
    )
    secret: str = Field(
        "configpin-tls",
        description="Secret in --namespace for self-managed certificates.",
        alias="cert_secret",
    )
    service_name: str = Field(
        "configpin",
        description="The Service whose DNS names the self-managed serving certificate carries.",
    )
    webhook_config_name: str = Field(
        "configpin",
        description=(
            "Its MutatingWebhookConfiguration, whose caBundle self-managed certificates keep."
        ),
    )


class Logging(Group):
    """What is logged, and how."""

    title: ClassVar[str] = "Logging"

    level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level: debug, info, warning or error.", alias="log_level"
    )
    format: Literal["text", "json"] = Field(
        "text",
        description=(
            "Log format: text, or json (one object a line: time, level, logger, message, and "
            "the workload, source and reason of a decision as fields where it names them)."
        ),
        alias="log_format",
    )
