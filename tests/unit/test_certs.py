from __future__ import annotations

import ipaddress
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook import certs


@pytest.fixture(scope="module")
def bundle() -> certs.CertBundle:
    return certs.generate("hook", "team-a", extra_dns=["hook.example.com"])


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
    certs.load_pair(bundle.cert_pem, bundle.key_pem)  # key belongs to the cert
    assert bundle.not_after == cert.not_valid_after_utc


def test_ca_is_a_p256_ca_that_may_sign_certificates(bundle: certs.CertBundle) -> None:
    ca = _cert(bundle.ca_cert_pem)
    ca_key = ca.public_key()
    assert isinstance(ca_key, ec.EllipticCurvePublicKey)
    assert ca_key.curve.name == "secp256r1"
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign is True
    ca.verify_directly_issued_by(ca)  # self-signed
    certs.load_pair(bundle.ca_cert_pem, bundle.ca_key_pem)


def test_not_before_allows_for_clock_skew(bundle: certs.CertBundle) -> None:
    cert = _cert(bundle.cert_pem)
    assert cert.not_valid_before_utc <= datetime.now(UTC) - timedelta(minutes=1)


def test_an_existing_ca_signs_the_new_cert(bundle: certs.CertBundle) -> None:
    again = certs.generate("other", "ns", ca=(bundle.ca_cert_pem, bundle.ca_key_pem))
    assert again.ca_cert_pem == bundle.ca_cert_pem
    _cert(again.cert_pem).verify_directly_issued_by(_cert(bundle.ca_cert_pem))
    assert again.cert_pem != bundle.cert_pem


def test_a_leaf_certificate_is_refused_as_ca(bundle: certs.CertBundle) -> None:
    with pytest.raises(certs.CertificateError, match="not a CA"):
        certs.generate("x", "y", ca=(bundle.cert_pem, bundle.key_pem))


def test_mismatched_pair_is_refused_without_showing_the_key(bundle: certs.CertBundle) -> None:
    other = certs.generate("hook", "team-a")
    with pytest.raises(certs.CertificateError) as e:
        certs.load_pair(bundle.cert_pem, other.key_pem)
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
    b = certs.generate("s", "n", validity_days=40)
    now = datetime.now(UTC)
    assert not certs.needs_renewal(b.cert_pem, now=now, before=timedelta(days=30))
    assert certs.needs_renewal(b.cert_pem, now=now, before=timedelta(days=45))
    assert certs.needs_renewal(b.cert_pem, now=now + timedelta(days=41), before=timedelta(0))
    assert certs.needs_renewal(b"not a certificate", now=now, before=timedelta(0))


def test_ensure_dev_certs_creates_then_leaves_alone(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    cert, key, ca = certs.ensure_dev_certs(out)
    assert (cert, key, ca) == (out / "tls.crt", out / "tls.key", out / "ca.crt")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    sans = _cert(cert.read_bytes()).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert "configpin.configpin.svc" in sans.value.get_values_for_type(x509.DNSName)

    before = {p.name: (p.read_bytes(), p.stat().st_ino) for p in out.iterdir()}
    assert certs.ensure_dev_certs(out) == (cert, key, ca)
    after = {p.name: (p.read_bytes(), p.stat().st_ino) for p in out.iterdir()}
    assert after == before


def test_ensure_dev_certs_renews_a_cert_close_to_expiry_keeping_the_ca(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    old = certs.generate("configpin", "configpin", validity_days=10)
    certs.write_bundle(old, out)

    cert, key, ca = certs.ensure_dev_certs(out)
    new_cert = _cert(cert.read_bytes())
    assert cert.read_bytes() != old.cert_pem
    assert new_cert.not_valid_after_utc > datetime.now(UTC) + timedelta(days=300)
    # The CA is still good, so it is reused: a caBundle already installed stays valid.
    assert ca.read_bytes() == old.ca_cert_pem
    new_cert.verify_directly_issued_by(_cert(old.ca_cert_pem))
    certs.load_pair(cert.read_bytes(), key.read_bytes())


@pytest.mark.parametrize("damage", ["missing_key", "garbage_cert", "wrong_key", "other_service"])
def test_ensure_dev_certs_replaces_unusable_files(tmp_path: Path, damage: str) -> None:
    out = tmp_path / "certs"
    certs.ensure_dev_certs(out)
    original = (out / "tls.crt").read_bytes()
    if damage == "missing_key":
        (out / "tls.key").unlink()
    elif damage == "garbage_cert":
        (out / "tls.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nnope\n")
    elif damage == "wrong_key":
        (out / "tls.key").write_bytes(certs.generate("a", "b").key_pem)

    service = "elsewhere" if damage == "other_service" else "configpin"
    cert, key, _ = certs.ensure_dev_certs(out, service=service)
    assert cert.read_bytes() != original
    certs.load_pair(cert.read_bytes(), key.read_bytes())


def test_ensure_dev_certs_replaces_an_unreadable_key(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    out = tmp_path / "certs"
    certs.ensure_dev_certs(out)
    original = (out / "tls.crt").read_bytes()
    (out / "tls.key").chmod(0)
    cert, key, _ = certs.ensure_dev_certs(out)
    assert cert.read_bytes() != original
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
