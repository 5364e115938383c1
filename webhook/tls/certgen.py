"""Making certificates: a small CA and a serving certificate signed by it (cryptography).

Imported only when a certificate is made or a CA is loaded to sign one: reading, checking and
serving certificates (`webhook.tls.certs`, `webhook.server.tls`) need only the standard library,
and cryptography costs about 10 MB of memory that a running server otherwise never uses.
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.tls.certs import (
    CA_VALIDITY_DAYS,
    CLOCK_SKEW,
    CertBundle,
    CertificateError,
    check_pair,
    service_dns_names,
)


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
        ca_cert, ca_key = load_ca(ca_cert_pem, ca_key_pem)

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


def load_ca(
    ca_cert_pem: bytes, ca_key_pem: bytes
) -> tuple[x509.Certificate, CertificateIssuerPrivateKeyTypes]:
    check_pair(ca_cert_pem, ca_key_pem)
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
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
        .add_extension(_key_usage(signs_certificates=True), critical=True)
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
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(_authority_key_id(ca_cert), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """A CA signs certificates and CRLs; a serving certificate only signs its handshakes."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
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
