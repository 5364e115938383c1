from __future__ import annotations

import logging
import os
import shutil
import ssl
import threading
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.unit.server._tls_app import client_context, handshake, running_server
from webhook.server.tls import ReloadingTLSContext
from webhook.tls import certgen, certs

# ---- a Secret volume as the kubelet lays it out ----


def mount_secret(root: Path, bundle: certs.CertBundle, stamp: str) -> None:
    """`root/..<stamp>/tls.*`, `root/..data -> ..<stamp>`, `root/tls.* -> ..data/tls.*`."""
    root.mkdir(parents=True, exist_ok=True)
    _write_payload(root / f"..{stamp}", bundle)
    (root / "..data").symlink_to(f"..{stamp}")
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (root / name).symlink_to(f"..data/{name}")


def update_secret(root: Path, bundle: certs.CertBundle, stamp: str) -> None:
    """What the kubelet's atomic writer does: new dir, swap `..data`, delete the old dir."""
    _write_payload(root / f"..{stamp}", bundle)
    old = os.readlink(root / "..data")
    tmp_link = root / "..data_tmp"
    tmp_link.symlink_to(f"..{stamp}")
    os.replace(tmp_link, root / "..data")
    shutil.rmtree(root / old)


def _write_payload(d: Path, bundle: certs.CertBundle) -> None:
    d.mkdir()
    (d / "tls.crt").write_bytes(bundle.cert_pem)
    (d / "tls.key").write_bytes(bundle.key_pem)
    (d / "ca.crt").write_bytes(bundle.ca_cert_pem)


# ---- handshakes in memory, without a server ----


def _handshake_step(side: ssl.SSLObject) -> bool:
    """One step of `side`'s handshake: True once it is done, False while it waits to read."""
    try:
        side.do_handshake()
    except ssl.SSLWantReadError:
        return False
    return True


def memory_handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> bytes:
    """Run one handshake through memory BIOs; return the certificate the server presented."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname="localhost")
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    client_done = server_done = False
    for _ in range(10):
        client_done = client_done or _handshake_step(client)
        s_in.write(c_out.read())
        server_done = server_done or _handshake_step(server)
        c_in.write(s_out.read())
        if client_done and server_done:
            der = client.getpeercert(binary_form=True)
            assert der is not None
            return der
    raise AssertionError("handshake did not finish")


def der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)


@pytest.fixture(scope="module")
def bundle_a() -> certs.CertBundle:
    return certgen.generate("configpin", "configpin")


@pytest.fixture(scope="module")
def bundle_b() -> certs.CertBundle:
    return certgen.generate("configpin", "configpin")  # a different CA as well


# ---- ReloadingTLSContext on its own ----


def test_context_is_a_tls12_plus_server_context(tmp_path: Path, bundle_a: certs.CertBundle) -> None:
    certs.write_bundle(bundle_a, tmp_path)
    tls = ReloadingTLSContext(tmp_path / "tls.crt", tmp_path / "tls.key")
    assert tls.context.protocol == ssl.PROTOCOL_TLS_SERVER
    assert tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert memory_handshake(tls.context, client_context(bundle_a.ca_cert_pem)) == der(
        bundle_a.cert_pem
    )
    assert tls.maybe_reload() is False  # nothing changed


def test_reload_follows_a_secret_volume_swap(
    tmp_path: Path, bundle_a: certs.CertBundle, bundle_b: certs.CertBundle
) -> None:
    mount_secret(tmp_path, bundle_a, "2026_01_01_00_00_00.1")
    tls = ReloadingTLSContext(tmp_path / "tls.crt", tmp_path / "tls.key")
    live = tls.context

    update_secret(tmp_path, bundle_b, "2026_01_02_00_00_00.2")
    assert tls.maybe_reload() is True
    assert tls.context is live  # same object the listener holds
    assert memory_handshake(live, client_context(bundle_b.ca_cert_pem)) == der(bundle_b.cert_pem)
    assert tls.maybe_reload() is False


def test_a_cert_without_its_key_keeps_the_old_pair_until_the_key_arrives(
    tmp_path: Path,
    bundle_a: certs.CertBundle,
    bundle_b: certs.CertBundle,
    caplog: pytest.LogCaptureFixture,
) -> None:
    certs.write_bundle(bundle_a, tmp_path)
    tls = ReloadingTLSContext(tmp_path / "tls.crt", tmp_path / "tls.key")
    both_cas = client_context(bundle_a.ca_cert_pem, bundle_b.ca_cert_pem)

    # A writer replaced the certificate but not yet the key.
    (tmp_path / "tls.crt").write_bytes(bundle_b.cert_pem)
    with caplog.at_level(logging.DEBUG, logger="webhook.server.tls"):
        assert tls.maybe_reload() is False
        assert tls.maybe_reload() is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # not once per poll
    assert "does not match" in warnings[0].getMessage()
    assert memory_handshake(tls.context, both_cas) == der(bundle_a.cert_pem)

    (tmp_path / "tls.key").write_bytes(bundle_b.key_pem)
    with caplog.at_level(logging.INFO, logger="webhook.server.tls"):
        assert tls.maybe_reload() is True
    assert any("Reloaded TLS certificate" in r.getMessage() for r in caplog.records)
    assert memory_handshake(tls.context, both_cas) == der(bundle_b.cert_pem)

    for key in (bundle_a.key_pem, bundle_b.key_pem):
        body = key.decode().splitlines()[1]
        assert body not in caplog.text


@pytest.mark.parametrize("damage", ["garbage_cert", "garbage_key", "missing_key"])
def test_broken_files_never_break_the_live_context(
    tmp_path: Path, bundle_a: certs.CertBundle, damage: str
) -> None:
    certs.write_bundle(bundle_a, tmp_path)
    tls = ReloadingTLSContext(tmp_path / "tls.crt", tmp_path / "tls.key")
    if damage == "garbage_cert":
        (tmp_path / "tls.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nAAAA\n")
    elif damage == "garbage_key":
        (tmp_path / "tls.key").write_bytes(b"not a key")
    else:
        (tmp_path / "tls.key").unlink()
    assert tls.maybe_reload() is False
    assert memory_handshake(tls.context, client_context(bundle_a.ca_cert_pem)) == der(
        bundle_a.cert_pem
    )


def test_a_bad_pair_at_startup_raises(
    tmp_path: Path, bundle_a: certs.CertBundle, bundle_b: certs.CertBundle
) -> None:
    (tmp_path / "tls.crt").write_bytes(bundle_a.cert_pem)
    (tmp_path / "tls.key").write_bytes(bundle_b.key_pem)
    with pytest.raises(certs.CertificateError):
        ReloadingTLSContext(tmp_path / "tls.crt", tmp_path / "tls.key")
    with pytest.raises(OSError):
        ReloadingTLSContext(tmp_path / "missing.crt", tmp_path / "tls.key")


# ---- the real server ----


def test_server_refuses_tls11_and_accepts_tls12(tmp_path: Path, bundle_a: certs.CertBundle) -> None:
    certs.write_bundle(bundle_a, tmp_path / "c")
    cert, key = tmp_path / "c" / "tls.crt", tmp_path / "c" / "tls.key"
    with running_server(tmp_path, cert, key, bundle_a.ca_cert_pem) as (_proc, port, _log):
        tls12 = client_context(bundle_a.ca_cert_pem)
        tls12.maximum_version = ssl.TLSVersion.TLSv1_2
        assert handshake(port, tls12) == (der(bundle_a.cert_pem), "TLSv1.2")
        assert handshake(port, client_context(bundle_a.ca_cert_pem))[1] == "TLSv1.3"

        old = _tls11_client(bundle_a.ca_cert_pem)
        with pytest.raises(ssl.SSLError) as e:
            handshake(port, old)
        # The client did send a hello (it could not have failed locally): the server hung up.
        assert "NO_PROTOCOLS_AVAILABLE" not in str(e.value)

    # Control: the same client completes a handshake with a server that allows TLS 1.1,
    # so the failure above is the server's doing.
    permissive = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    permissive.set_ciphers("DEFAULT:@SECLEVEL=0")
    with pytest.warns(DeprecationWarning):
        permissive.minimum_version = ssl.TLSVersion.TLSv1_1
    permissive.load_cert_chain(cert, key)
    assert memory_handshake(permissive, old) == der(bundle_a.cert_pem)


def _tls11_client(ca_pem: bytes) -> ssl.SSLContext:
    ctx = client_context(ca_pem)
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # OpenSSL 3 needs this to speak TLS 1.1 at all
    with pytest.warns(DeprecationWarning):
        ctx.minimum_version = ssl.TLSVersion.TLSv1_1
    with pytest.warns(DeprecationWarning):
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    return ctx


def test_server_presents_the_new_cert_after_a_secret_swap_without_failed_handshakes(
    tmp_path: Path, bundle_a: certs.CertBundle, bundle_b: certs.CertBundle
) -> None:
    secret = tmp_path / "secret"
    mount_secret(secret, bundle_a, "2026_01_01_00_00_00.1")
    new_ca_only = client_context(bundle_b.ca_cert_pem)
    either_ca = client_context(bundle_a.ca_cert_pem, bundle_b.ca_cert_pem)
    a, b = der(bundle_a.cert_pem), der(bundle_b.cert_pem)

    with running_server(tmp_path, secret / "tls.crt", secret / "tls.key", bundle_a.ca_cert_pem) as (
        _proc,
        port,
        log,
    ):
        seen: list[tuple[float, bytes]] = []  # (when the handshake started, the cert served)
        failures: list[BaseException] = []
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    seen.append((started, handshake(port, either_ca)[0]))
                except Exception as e:
                    failures.append(e)

        threads = [threading.Thread(target=hammer) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.3)
            update_secret(secret, bundle_b, "2026_01_02_00_00_00.2")
            swapped = time.monotonic()
            deadline = swapped + 8
            while True:
                try:
                    assert handshake(port, new_ca_only)[0] == b
                    served_new = time.monotonic()
                    break
                except ssl.SSLCertVerificationError:
                    assert time.monotonic() < deadline, "new certificate not served in time"
                    time.sleep(0.1)
            time.sleep(0.2)  # some handshakes after the reload, too
        finally:
            stop.set()
            for t in threads:
                t.join()

        assert failures == []
        assert {cert for _, cert in seen} == {a, b}
        # Once the new certificate is served, no handshake begun afterwards gets the old one
        # (one begun before may still finish with it, however long its thread was held up).
        assert [cert for started, cert in seen if started > served_new and cert != b] == []
        assert any(started > served_new for started, _ in seen)
        assert "Reloaded TLS certificate" in log.read_text()
        assert bundle_b.key_pem.decode().splitlines()[1] not in log.read_text()
