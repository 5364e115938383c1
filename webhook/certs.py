"""Certificates for the webhook's HTTPS endpoint: a small CA and a serving certificate.

The API server calls the webhook through its Service, so the serving certificate must name
every form of the Service's DNS name, and the CA goes into the webhook configuration's
`caBundle`. Keys are ECDSA P-256: small, fast handshakes, accepted by every API server.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"

# A CA that outlives the serving certificates it signs lets a renewal reuse it, so the
# caBundle already in the webhook configuration stays valid across renewals.
CA_VALIDITY_DAYS = 3650
# Nodes and laptops disagree about the time by a little; a certificate that is "not yet
# valid" for a few seconds fails every handshake, so start validity in the past.
CLOCK_SKEW = timedelta(minutes=5)
RENEW_BEFORE = timedelta(days=30)


class CertificateError(Exception):
    """Raised when a certificate or key cannot be used as given."""


@dataclass(frozen=True)
class CertBundle:
    ca_cert_pem: bytes
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    not_after: datetime


def service_dns_names(service: str, namespace: str) -> list[str]:
    """Every name the API server or a pod may use to reach the Service."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
        "localhost",
    ]


def generate(
    service: str,
    namespace: str,
    *,
    extra_dns: Sequence[str] = (),
    extra_ips: Sequence[str] = ("127.0.0.1",),
    validity_days: int = 365,
    ca: tuple[bytes, bytes] | None = None,
) -> CertBundle:
    """Create a serving certificate for `<service>.<namespace>.svc`, and a CA unless one is given.

    `ca` is an existing `(ca_cert_pem, ca_key_pem)`; the serving certificate then never
    outlives that CA.
    """
    if validity_days <= 0:
        raise ValueError("validity_days must be positive")
    now = datetime.now(UTC)
    not_before = now - CLOCK_SKEW

    if ca is None:
        ca_key: CertificateIssuerPrivateKeyTypes = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _make_ca(ca_key, service, namespace, not_before, now)
        ca_cert_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
        ca_key_pem = _key_pem(ca_key)
    else:
        ca_cert_pem, ca_key_pem = ca
        ca_cert, ca_key = _load_ca(ca_cert_pem, ca_key_pem)

    not_after = min(now + timedelta(days=validity_days), ca_cert.not_valid_after_utc)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _make_serving_cert(
        key.public_key(),
        ca_cert,
        ca_key,
        dns_names=_unique([*service_dns_names(service, namespace), *extra_dns]),
        ips=[ipaddress.ip_address(ip) for ip in _unique(list(extra_ips))],
        common_name=f"{service}.{namespace}.svc",
        not_before=not_before,
        not_after=not_after,
    )
    return CertBundle(
        ca_cert_pem=ca_cert_pem,
        ca_key_pem=ca_key_pem,
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=_key_pem(key),
        not_after=cert.not_valid_after_utc,
    )


def write_bundle(bundle: CertBundle, out_dir: Path) -> None:
    """Write `ca.crt`, `ca.key`, `tls.crt`, `tls.key` into `out_dir`, each file atomically.

    The key is written before its certificate so a reader that polls the files sees the
    new pair complete as soon as it sees the new certificate (readers must still check
    that the two match: they may read between the two renames).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(out_dir / CA_KEY_FILE, bundle.ca_key_pem, 0o600)
    _write_atomic(out_dir / CA_CERT_FILE, bundle.ca_cert_pem, 0o644)
    _write_atomic(out_dir / KEY_FILE, bundle.key_pem, 0o600)
    _write_atomic(out_dir / CERT_FILE, bundle.cert_pem, 0o644)


def needs_renewal(cert_pem: bytes, *, now: datetime, before: timedelta) -> bool:
    """True when the certificate expires within `before` of `now`, or cannot be parsed."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return True
    return now + before >= cert.not_valid_after_utc


def ensure_dev_certs(
    out_dir: Path, *, service: str = "configpin", namespace: str = "configpin"
) -> tuple[Path, Path, Path]:
    """Return `(cert, key, ca)` paths in `out_dir`, creating or renewing the files when needed.

    Existing files are kept when they are readable, the key matches the certificate, the
    certificate names `<service>.<namespace>.svc`, and it is valid for more than 30 days.
    A still-good CA (with its key) is reused on renewal so clients that trust it keep working.
    """
    cert_path, key_path, ca_path = out_dir / CERT_FILE, out_dir / KEY_FILE, out_dir / CA_CERT_FILE
    now = datetime.now(UTC)
    if _usable(cert_path, key_path, ca_path, f"{service}.{namespace}.svc", now):
        return cert_path, key_path, ca_path

    bundle = generate(service, namespace, ca=_reusable_ca(out_dir, now))
    write_bundle(bundle, out_dir)
    return cert_path, key_path, ca_path


def load_pair(cert_pem: bytes, key_pem: bytes) -> list[x509.Certificate]:
    """Parse a PEM certificate chain and its private key and check that they belong together.

    Returns the chain (leaf first). Raises CertificateError with a message that never
    contains key material.
    """
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError as e:
        raise CertificateError(f"certificate is not valid PEM: {e}") from e
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as e:
        # The exception text never includes the key bytes, but do not pass it on anyway.
        raise CertificateError("private key is not a valid unencrypted PEM key") from e
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if chain[0].public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        raise CertificateError("private key does not match the certificate")
    return chain


def _usable(cert_path: Path, key_path: Path, ca_path: Path, dns_name: str, now: datetime) -> bool:
    try:
        cert_pem, key_pem = cert_path.read_bytes(), key_path.read_bytes()
        ca_pem = ca_path.read_bytes()
        chain = load_pair(cert_pem, key_pem)
        ca_cert = x509.load_pem_x509_certificate(ca_pem)
    except (OSError, ValueError, CertificateError):
        return False
    if needs_renewal(cert_pem, now=now, before=RENEW_BEFORE):
        return False
    try:
        sans = chain[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    if dns_name not in sans.get_values_for_type(x509.DNSName):
        return False
    try:
        chain[0].verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _reusable_ca(out_dir: Path, now: datetime) -> tuple[bytes, bytes] | None:
    try:
        ca_cert_pem = (out_dir / CA_CERT_FILE).read_bytes()
        ca_key_pem = (out_dir / CA_KEY_FILE).read_bytes()
        _load_ca(ca_cert_pem, ca_key_pem)
    except (OSError, CertificateError):
        return None
    if needs_renewal(ca_cert_pem, now=now, before=RENEW_BEFORE):
        return None
    return ca_cert_pem, ca_key_pem


def _load_ca(
    ca_cert_pem: bytes, ca_key_pem: bytes
) -> tuple[x509.Certificate, CertificateIssuerPrivateKeyTypes]:
    chain = load_pair(ca_cert_pem, ca_key_pem)
    ca_cert = chain[0]
    try:
        is_ca = ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise CertificateError("the given CA certificate is not a CA (basicConstraints CA:false)")
    key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CertificateError(f"unsupported CA key type {type(key).__name__}")
    return ca_cert, key


def _make_ca(
    key: CertificateIssuerPrivateKeyTypes,
    service: str,
    namespace: str,
    not_before: datetime,
    now: datetime,
) -> x509.Certificate:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "configpin"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"configpin CA for {service}.{namespace}"),
        ]
    )
    public_key = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public_key)
        .serial_number(_serial())
        .not_valid_before(not_before)
        .not_valid_after(now + timedelta(days=CA_VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .sign(key, hashes.SHA256())
    )


def _make_serving_cert(
    public_key: ec.EllipticCurvePublicKey,
    ca_cert: x509.Certificate,
    ca_key: CertificateIssuerPrivateKeyTypes,
    *,
    dns_names: list[str],
    ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address],
    common_name: str,
    not_before: datetime,
    not_after: datetime,
) -> x509.Certificate:
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ip) for ip in ips]
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(_serial())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(_authority_key_id(ca_cert), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _authority_key_id(ca_cert: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    # Must equal the CA's own subjectKeyIdentifier, which a CA made elsewhere may have
    # computed differently from the public key than we would.
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        key = ca_cert.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
            raise CertificateError("unsupported CA public key type") from None
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(key)
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def _key_pem(key: CertificateIssuerPrivateKeyTypes) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _serial() -> int:
    # RFC 5280: positive, at most 20 octets; 159 random bits leave the top bit clear.
    return secrets.randbits(159) | 1


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    # mkstemp creates the file 0600, so a key is never readable by others, not even briefly.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
