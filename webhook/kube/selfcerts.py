"""Self-managed serving certificates: no cert-manager needed.

The CA and the serving certificate live in one Secret of configpin's namespace (`ca.crt`,
`ca.key`, `tls.crt`, `tls.key`); every replica writes the pair to files that the reloading
TLS context serves, and keeps the webhook configuration's caBundle current. Order matters for
"no failed admission": the caBundle must trust a CA before any replica serves a certificate
it signed. Serving-certificate renewals keep the CA, so they are always safe; a CA nearing
its end is replaced by putting the new CA beside the old one in the bundle first.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from webhook.kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from webhook.kube.raw import Kube, path
from webhook.kube.webhookconfig import set_ca_bundle
from webhook.tls.certs import CertificateError, CertInfo, needs_renewal, read_certificates

log = logging.getLogger(__name__)

CA_RENEW_BEFORE = timedelta(days=365)
_FILES = ("ca.crt", "ca.key", "tls.crt", "tls.key")


@dataclass(frozen=True)
class Material:
    ca_pem: bytes  # one or two CA certificates (old and new during a CA change)
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    resource_version: str | None = None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _decode(secret: dict[str, object]) -> Material | None:
    data = secret.get("data")
    if not isinstance(data, dict) or not all(k in data for k in _FILES):
        return None
    meta = secret.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    ca, ca_key, cert, key = (base64.b64decode(str(data[k])) for k in _FILES)
    return Material(ca, ca_key, cert, key, str(rv) if rv else None)


def _newest_ca(ca_pem: bytes) -> CertInfo:
    return max(read_certificates(ca_pem), key=lambda c: c.not_after)


def _covers(cert_pem: bytes, dns_name: str) -> bool:
    try:
        return dns_name in read_certificates(cert_pem)[0].dns_names
    except CertificateError:
        return False


class SelfManagedCerts:
    def __init__(
        self,
        kube: Kube,
        *,
        namespace: str,
        secret: str,
        service: str,
        webhook_config: str | None,
        out_dir: Path,
        validity_days: int = 365,
        renew_before: timedelta = timedelta(days=30),
        check_interval: float = 3600.0,
        bundle_settle: float = 10.0,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.secret = secret
        self.service = service
        self.webhook_config = webhook_config
        self.out_dir = out_dir
        self.validity_days = validity_days
        self.renew_before = renew_before
        self.check_interval = check_interval
        self.bundle_settle = bundle_settle
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.current: Material | None = None

    @property
    def cert_file(self) -> Path:
        return self.out_dir / "tls.crt"

    @property
    def key_file(self) -> Path:
        return self.out_dir / "tls.key"

    # --- one pass
    def _read(self) -> Material | None:
        try:
            return _decode(self.kube.get(path("secrets", self.namespace, self.secret)))
        except NotFound:
            return None

    def _new(self, ca: tuple[bytes, bytes] | None) -> Material:
        from webhook.tls import certgen  # noqa: PLC0415 (cryptography only to make a certificate)

        b = certgen.generate(self.service, self.namespace, validity_days=self.validity_days, ca=ca)
        return Material(b.ca_cert_pem, b.ca_key_pem, b.cert_pem, b.key_pem)

    def _store(self, material: Material, previous: Material | None) -> Material:
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": self.secret,
                "namespace": self.namespace,
                "labels": {
                    "app.kubernetes.io/name": "configpin",
                    "app.kubernetes.io/component": "serving-cert",
                },
            },
            "data": {
                "ca.crt": _b64(material.ca_pem),
                "ca.key": _b64(material.ca_key_pem),
                "tls.crt": _b64(material.cert_pem),
                "tls.key": _b64(material.key_pem),
            },
        }
        if previous is None:
            stored = self.kube.create(path("secrets", self.namespace), body)
        else:
            body["metadata"]["resourceVersion"] = previous.resource_version  # type: ignore[index]
            stored = self.kube.replace(path("secrets", self.namespace, self.secret), body)
        out = _decode(stored)
        assert out is not None
        return out

    def _plan(self, current: Material | None, now: datetime) -> tuple[Material, bool]:
        """The material to serve, and whether the Secret must be written."""
        if current is None:
            return self._new(None), True
        dns = f"{self.service}.{self.namespace}.svc"
        ca = _newest_ca(current.ca_pem)
        if now + CA_RENEW_BEFORE >= ca.not_after:
            fresh = self._new(None)
            # Trust both while replicas switch; the old CA drops out at the next CA change.
            bundle = fresh.ca_pem + ca.pem
            return Material(
                bundle, fresh.ca_key_pem, fresh.cert_pem, fresh.key_pem, current.resource_version
            ), True
        if needs_renewal(current.cert_pem, now=now, before=self.renew_before) or not _covers(
            current.cert_pem, dns
        ):
            renewed = self._new((ca.pem, current.ca_key_pem))
            return Material(current.ca_pem, current.ca_key_pem, renewed.cert_pem, renewed.key_pem,
                            current.resource_version), True  # fmt: skip
        return current, False

    def reconcile(self) -> Material:
        """Make the Secret, the files and the caBundle agree; renew what needs it."""
        for _attempt in range(5):
            current = self._read()
            material, write = self._plan(current, datetime.now(UTC))
            if write:
                # The bundle first: nobody may serve a certificate the API server does not trust.
                self._publish_bundle(material.ca_pem + (current.ca_pem if current else b""))
                if current is not None and material.ca_pem != current.ca_pem:
                    self._stop.wait(self.bundle_settle)
                try:
                    material = self._store(material, current)
                    log.info(
                        "stored a new serving certificate in Secret %s/%s",
                        self.namespace,
                        self.secret,
                    )
                except (AlreadyExists, Conflict):
                    continue  # another replica wrote first: use theirs
            self._write_files(material)
            self._publish_bundle(material.ca_pem)
            self.current = material
            return material
        raise KubeError(f"Secret {self.namespace}/{self.secret}", 409, "kept conflicting")

    def _publish_bundle(self, ca_pem: bytes) -> None:
        if not self.webhook_config:
            return
        unique = b"".join(c.pem for c in _unique_certs(ca_pem))
        try:
            if set_ca_bundle(self.kube, self.webhook_config, unique):
                log.info(
                    "updated the caBundle of MutatingWebhookConfiguration %s", self.webhook_config
                )
        except KubeError as e:
            log.warning("could not update the caBundle of %s: %s", self.webhook_config, e)

    def _write_files(self, material: Material) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # Key first, then certificate: the TLS reloader checks the pair before using it.
        for name, data, mode in (
            ("tls.key", material.key_pem, 0o600),
            ("tls.crt", material.cert_pem, 0o644),
        ):
            target = self.out_dir / name
            if target.exists() and target.read_bytes() == data:
                continue
            tmp = target.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, target)

    # --- background
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="self-managed-certs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.check_interval):
            try:
                self.reconcile()
            except Exception as e:
                log.warning(
                    "certificate check failed (%s); retrying in %.0fs", e, self.check_interval
                )


def _unique_certs(pem: bytes) -> list[CertInfo]:
    seen: dict[bytes, CertInfo] = {}
    for cert in read_certificates(pem):
        seen.setdefault(cert.der, cert)
    return list(seen.values())
