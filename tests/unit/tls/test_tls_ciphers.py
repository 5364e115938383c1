"""TLS 1.2 cipher suites: ECDHE with AEAD only by default; `--tls-cipher-suites` in Kubernetes'
names widens or narrows that; TLS 1.3 is unaffected."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.unit.server.test_tls_reload import memory_handshake
from webhook.process.config import Settings
from webhook.server.tls import ReloadingTLSContext
from webhook.tls import certgen, certs
from webhook.tls.ciphers import DEFAULT_CIPHER_SUITES, openssl_ciphers


@pytest.fixture(scope="module")
def bundle() -> certs.CertBundle:
    return certgen.generate("configpin", "configpin")  # an ECDSA certificate


def _server(tmp_path: Path, bundle: certs.CertBundle, **kw: object) -> ReloadingTLSContext:
    certs.write_bundle(bundle, tmp_path)
    return ReloadingTLSContext(tmp_path / "tls.crt", tmp_path / "tls.key", **kw)  # type: ignore[arg-type]


def _tls12_client(bundle: certs.CertBundle, ciphers: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=bundle.ca_cert_pem.decode())
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(ciphers)
    return ctx


# The two CBC suites the old default accepted, and an AEAD one.
CBC = ("ECDHE-ECDSA-AES128-SHA256", "ECDHE-ECDSA-AES256-SHA384", "ECDHE-ECDSA-AES128-SHA")


@pytest.mark.parametrize("suite", CBC)
def test_tls12_refuses_cbc_suites_by_default(
    tmp_path: Path, bundle: certs.CertBundle, suite: str
) -> None:
    server = _server(tmp_path, bundle)
    with pytest.raises(ssl.SSLError):
        memory_handshake(server.context, _tls12_client(bundle, suite))


@pytest.mark.parametrize(
    "suite",
    [
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
    ],
)
def test_tls12_accepts_ecdhe_aead_suites(
    tmp_path: Path, bundle: certs.CertBundle, suite: str
) -> None:
    server = _server(tmp_path, bundle)
    assert memory_handshake(server.context, _tls12_client(bundle, suite))


def test_every_tls12_suite_offered_by_default_is_ecdhe_with_aead(
    tmp_path: Path, bundle: certs.CertBundle
) -> None:
    server = _server(tmp_path, bundle)
    tls12 = [c for c in server.context.get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert tls12
    for c in tls12:
        assert c["kea"] == "kx-ecdhe" and c["aead"] is True, c["name"]


def test_cipher_suites_by_kubernetes_name_allow_what_they_name(
    tmp_path: Path, bundle: certs.CertBundle
) -> None:
    server = _server(
        tmp_path,
        bundle,
        cipher_suites=["TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256", "TLS_AES_128_GCM_SHA256"],
    )
    assert memory_handshake(server.context, _tls12_client(bundle, "ECDHE-ECDSA-AES128-SHA256"))
    with pytest.raises(ssl.SSLError):
        memory_handshake(server.context, _tls12_client(bundle, "ECDHE-ECDSA-AES128-GCM-SHA256"))
    # TLS 1.3 keeps its own (AEAD) suites whatever the list
    client13 = ssl.create_default_context(cadata=bundle.ca_cert_pem.decode())
    client13.minimum_version = ssl.TLSVersion.TLSv1_3
    assert memory_handshake(server.context, client13)


def test_unknown_or_empty_suite_lists_are_refused() -> None:
    with pytest.raises(ValueError, match="TLS_BOGUS"):
        openssl_ciphers(["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_BOGUS"])
    with pytest.raises(ValueError, match=r"no TLS 1\.2"):
        openssl_ciphers(["TLS_AES_128_GCM_SHA256"])


def test_the_setting_takes_comma_separated_names_and_checks_them() -> None:
    assert Settings().server.cipher_suites == DEFAULT_CIPHER_SUITES
    s = Settings(tls_cipher_suites=" TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 ,TLS_AES_128_GCM_SHA256")
    assert s.server.cipher_suites == (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "TLS_AES_128_GCM_SHA256",
    )
    with pytest.raises(ValidationError, match="TLS_RSA_WITH_NOTHING"):
        Settings(tls_cipher_suites="TLS_RSA_WITH_NOTHING")


def test_the_idle_timeout_stays_above_the_api_servers_90_seconds() -> None:
    assert Settings().server.keep_alive_timeout > 90
    with pytest.raises(ValidationError):
        Settings(keep_alive_timeout=60)
