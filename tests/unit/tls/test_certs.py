from __future__ import annotations

import ipaddress
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.tls import certgen, certs, devcerts


@pytest.fixture(scope="module")
def bundle() -> certs.CertBundle:
    return certgen.generate("hook", "team-a", extra_dns=["hook.example.com"])


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def test_serving_cert_names_every_form_of_the_service(bundle: certs.CertBundle) -> None:
    cert = _cert(bundle.cert_pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "hook",
        "hook.team-a",
        "hook.team-a.svc",
        "hook.team-a.svc.cluster.local",
        "localhost",
        "hook.example.com",
    ]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert cn == "hook.team-a.svc"


def test_serving_cert_is_a_p256_server_cert_signed_by_the_ca(bundle: certs.CertBundle) -> None:
    cert, ca = _cert(bundle.cert_pem), _cert(bundle.ca_cert_pem)
    public_key = cert.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    assert public_key.curve.name == "secp256r1"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False

    cert.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    certs.check_pair(bundle.cert_pem, bundle.key_pem)  # key belongs to the cert
    assert bundle.not_after == cert.not_valid_after_utc


def test_ca_is_a_p256_ca_that_may_sign_certificates(bundle: certs.CertBundle) -> None:
    ca = _cert(bundle.ca_cert_pem)
    ca_key = ca.public_key()
    assert isinstance(ca_key, ec.EllipticCurvePublicKey)
    assert ca_key.curve.name == "secp256r1"
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign is True
    ca.verify_directly_issued_by(ca)  # self-signed
    certs.check_pair(bundle.ca_cert_pem, bundle.ca_key_pem)


def test_not_before_allows_for_clock_skew(bundle: certs.CertBundle) -> None:
    cert = _cert(bundle.cert_pem)
    assert cert.not_valid_before_utc <= datetime.now(UTC) - timedelta(minutes=1)


def test_an_existing_ca_signs_the_new_cert(bundle: certs.CertBundle) -> None:
    again = certgen.generate("other", "ns", ca=(bundle.ca_cert_pem, bundle.ca_key_pem))
    assert again.ca_cert_pem == bundle.ca_cert_pem
    _cert(again.cert_pem).verify_directly_issued_by(_cert(bundle.ca_cert_pem))
    assert again.cert_pem != bundle.cert_pem


def test_a_leaf_certificate_is_refused_as_ca(bundle: certs.CertBundle) -> None:
    with pytest.raises(certs.CertificateError, match="not a CA"):
        certgen.generate("x", "y", ca=(bundle.cert_pem, bundle.key_pem))


def test_mismatched_pair_is_refused_without_showing_the_key(bundle: certs.CertBundle) -> None:
    other = certgen.generate("hook", "team-a")
    with pytest.raises(certs.CertificateError) as e:
        certs.check_pair(bundle.cert_pem, other.key_pem)
    assert "does not match" in str(e.value)
    assert other.key_pem.decode() not in str(e.value)


def test_write_bundle_modes_and_contents(tmp_path: Path, bundle: certs.CertBundle) -> None:
    out = tmp_path / "certs"
    certs.write_bundle(bundle, out)
    assert (out / "ca.crt").read_bytes() == bundle.ca_cert_pem
    assert (out / "tls.crt").read_bytes() == bundle.cert_pem
    assert (out / "tls.key").read_bytes() == bundle.key_pem
    assert (out / "ca.key").read_bytes() == bundle.ca_key_pem
    assert stat.S_IMODE((out / "tls.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "tls.crt").stat().st_mode) == 0o644
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]


def test_needs_renewal() -> None:
    b = certgen.generate("s", "n", validity_days=40)
    now = datetime.now(UTC)
    assert not certs.needs_renewal(b.cert_pem, now=now, before=timedelta(days=30))
    assert certs.needs_renewal(b.cert_pem, now=now, before=timedelta(days=45))
    assert certs.needs_renewal(b.cert_pem, now=now + timedelta(days=41), before=timedelta(0))
    assert certs.needs_renewal(b"not a certificate", now=now, before=timedelta(0))


def test_ensure_dev_certs_creates_then_leaves_alone(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    cert, key, ca = devcerts.ensure_dev_certs(out)
    assert (cert, key, ca) == (out / "tls.crt", out / "tls.key", out / "ca.crt")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    sans = _cert(cert.read_bytes()).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert "configpin.configpin.svc" in sans.value.get_values_for_type(x509.DNSName)

    before = {p.name: (p.read_bytes(), p.stat().st_ino) for p in out.iterdir()}
    assert devcerts.ensure_dev_certs(out) == (cert, key, ca)
    after = {p.name: (p.read_bytes(), p.stat().st_ino) for p in out.iterdir()}
    assert after == before


def test_ensure_dev_certs_renews_a_cert_close_to_expiry_keeping_the_ca(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    old = certgen.generate("configpin", "configpin", validity_days=10)
    certs.write_bundle(old, out)

    cert, key, ca = devcerts.ensure_dev_certs(out)
    new_cert = _cert(cert.read_bytes())
    assert cert.read_bytes() != old.cert_pem
    assert new_cert.not_valid_after_utc > datetime.now(UTC) + timedelta(days=300)
    # The CA is still good, so it is reused: a caBundle already installed stays valid.
    assert ca.read_bytes() == old.ca_cert_pem
    new_cert.verify_directly_issued_by(_cert(old.ca_cert_pem))
    certs.check_pair(cert.read_bytes(), key.read_bytes())


@pytest.mark.parametrize(
    "damage", ["missing_key", "garbage_cert", "wrong_key", "other_service", "other_ca"]
)
def test_ensure_dev_certs_replaces_unusable_files(tmp_path: Path, damage: str) -> None:
    out = tmp_path / "certs"
    devcerts.ensure_dev_certs(out)
    original = (out / "tls.crt").read_bytes()
    if damage == "missing_key":
        (out / "tls.key").unlink()
    elif damage == "garbage_cert":
        (out / "tls.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nnope\n")
    elif damage == "wrong_key":
        (out / "tls.key").write_bytes(certgen.generate("a", "b").key_pem)
    elif damage == "other_ca":  # tls.crt was not signed by the CA beside it
        other = certgen.generate("configpin", "configpin")
        (out / "ca.crt").write_bytes(other.ca_cert_pem)
        (out / "ca.key").write_bytes(other.ca_key_pem)

    service = "elsewhere" if damage == "other_service" else "configpin"
    cert, key, _ = devcerts.ensure_dev_certs(out, service=service)
    assert cert.read_bytes() != original
    certs.check_pair(cert.read_bytes(), key.read_bytes())


def test_ensure_dev_certs_replaces_an_unreadable_key(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    out = tmp_path / "certs"
    devcerts.ensure_dev_certs(out)
    original = (out / "tls.crt").read_bytes()
    (out / "tls.key").chmod(0)
    cert, key, _ = devcerts.ensure_dev_certs(out)
    assert cert.read_bytes() != original
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


# ---- reading certificates with the standard library, checked against cryptography ----------


def _made(
    subject: x509.Name,
    *,
    not_after: datetime,
    sans: list[x509.GeneralName] | None,
    serial: int,
    rsa_key: bool = False,
) -> bytes:
    key = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if rsa_key
        else ec.generate_private_key(ec.SECP256R1())
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(datetime(2020, 1, 1, tzinfo=UTC))
        .not_valid_after(not_after)
    )
    if sans is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


@pytest.mark.parametrize(
    ("subject", "not_after", "sans", "rsa_key"),
    [
        # UTCTime before 2050, a DN with characters RFC 4514 escapes, a multi-valued RDN
        (
            x509.Name(
                [
                    x509.RelativeDistinguishedName(
                        [
                            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "a, b+c"),
                            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "#x "),
                        ]
                    ),
                    x509.RelativeDistinguishedName(
                        [x509.NameAttribute(NameOID.COMMON_NAME, 'sé "q" <x>;\\')]
                    ),
                ]
            ),
            datetime(2049, 12, 31, 23, 59, 59, tzinfo=UTC),
            [x509.DNSName("a.example"), x509.IPAddress(ipaddress.ip_address("::1"))],
            True,
        ),
        # GeneralizedTime from 2050 on, no subjectAltName at all
        (
            x509.Name(
                [
                    x509.NameAttribute(NameOID.COUNTRY_NAME, "DE"),
                    x509.NameAttribute(NameOID.DOMAIN_COMPONENT, "example"),
                    x509.NameAttribute(NameOID.EMAIL_ADDRESS, "x@example.com"),
                ]
            ),
            datetime(2061, 3, 4, 5, 6, 7, tzinfo=UTC),
            None,
            False,
        ),
        # IP addresses only
        (
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ip")]),
            datetime(2030, 1, 1, tzinfo=UTC),
            [x509.IPAddress(ipaddress.ip_address("10.0.0.1"))],
            False,
        ),
    ],
)
def test_read_certificates_agrees_with_cryptography(
    subject: x509.Name, not_after: datetime, sans: list[x509.GeneralName] | None, rsa_key: bool
) -> None:
    pem = _made(subject, not_after=not_after, sans=sans, serial=(1 << 150) + 7, rsa_key=rsa_key)
    info = certs.read_certificates(pem)[0]
    cert = _cert(pem)
    assert info.serial == cert.serial_number
    assert info.not_after == cert.not_valid_after_utc == not_after
    expected_dns = [n.value for n in sans or [] if isinstance(n, x509.DNSName)]
    assert list(info.dns_names) == expected_dns
    assert info.pem == pem
    assert info.sha256 == cert.fingerprint(hashes.SHA256()).hex()
    if all(a.oid != NameOID.EMAIL_ADDRESS for a in subject):  # printed as a dotted OID here
        assert info.subject == cert.subject.rfc4514_string()


def test_read_certificates_reads_a_bundle_in_order(bundle: certs.CertBundle) -> None:
    other = certgen.generate("x", "y")
    infos = certs.read_certificates(bundle.ca_cert_pem + b"\n" + other.ca_cert_pem)
    assert [i.pem for i in infos] == [bundle.ca_cert_pem, other.ca_cert_pem]


@pytest.mark.parametrize(
    "pem",
    [
        b"",
        b"not a certificate",
        b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n",
        b"-----BEGIN CERTIFICATE-----\nMIIBIjANBgkq\n-----END CERTIFICATE-----\n",  # truncated
        b"-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n",  # empty sequence
    ],
)
def test_read_certificates_refuses_what_is_not_a_certificate(pem: bytes) -> None:
    with pytest.raises(certs.CertificateError, match="not valid PEM"):
        certs.read_certificates(pem)


def test_check_pair_refuses_a_key_that_is_not_a_key(bundle: certs.CertBundle) -> None:
    with pytest.raises(certs.CertificateError, match="not a valid unencrypted PEM key"):
        certs.check_pair(bundle.cert_pem, b"-----BEGIN PRIVATE KEY-----\nAAAA\n")
    encrypted = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    with pytest.raises(certs.CertificateError, match="not a valid unencrypted PEM key"):
        certs.check_pair(bundle.cert_pem, encrypted)
