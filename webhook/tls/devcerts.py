"""Development certificates: the serving certificate `configpin serve` makes for itself in
`--certs-dir` when it is given no `--tls-cert`/`--tls-key`, kept across runs while it still
serves.

Checking the files on disk takes only the standard library (`webhook.tls.certs`); cryptography
(`webhook.tls.certgen`) is imported only when a certificate or its CA must be made again."""

from __future__ import annotations

import ssl
from datetime import UTC, datetime
from pathlib import Path

from webhook.tls.certs import (
    CA_CERT_FILE,
    CA_KEY_FILE,
    CERT_FILE,
    KEY_FILE,
    RENEW_BEFORE,
    CertificateError,
    needs_renewal,
    no_password,
    private_files,
    write_bundle,
)


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

    from webhook.tls import certgen  # noqa: PLC0415 (cryptography only to make a certificate)

    bundle = certgen.generate(service, namespace, ca=_reusable_ca(out_dir, now))
    write_bundle(bundle, out_dir)
    return cert_path, key_path, ca_path


def _usable(cert_path: Path, key_path: Path, ca_path: Path, dns_name: str, now: datetime) -> bool:
    try:
        cert_pem, key_pem = cert_path.read_bytes(), key_path.read_bytes()
        ca_pem = ca_path.read_bytes()
    except OSError:
        return False
    if needs_renewal(cert_pem, now=now, before=RENEW_BEFORE):
        return False
    return _serves(cert_pem, key_pem, ca_pem, dns_name)


def _serves(cert_pem: bytes, key_pem: bytes, ca_pem: bytes, dns_name: str) -> bool:
    """A TLS handshake in memory between a server holding the pair and a client trusting only
    `ca_pem` that asks for `dns_name`: it succeeds when the key belongs to the certificate,
    the CA signed it, it names `dns_name` and it is valid now (OpenSSL checks each)."""
    try:
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with private_files(cert_pem, key_pem) as (cert_file, key_file):
            server.load_cert_chain(cert_file, key_file, password=no_password)
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the name
        client.load_verify_locations(cadata=ca_pem.decode("ascii"))
    except (ssl.SSLError, ValueError):
        return False
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    ends = (
        (client.wrap_bio(c_in, c_out, server_hostname=dns_name), c_out, s_in),
        (server.wrap_bio(s_in, s_out, server_side=True), s_out, c_in),
    )
    done = [False, False]
    for _ in range(8):
        for i, (end, outgoing, peer) in enumerate(ends):
            if not done[i]:
                try:
                    end.do_handshake()
                    done[i] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError:
                    return False
            peer.write(outgoing.read())
        if all(done):
            return True
    return False


def _reusable_ca(out_dir: Path, now: datetime) -> tuple[bytes, bytes] | None:
    from webhook.tls import certgen  # noqa: PLC0415 (cryptography only to make a certificate)

    try:
        ca_cert_pem = (out_dir / CA_CERT_FILE).read_bytes()
        ca_key_pem = (out_dir / CA_KEY_FILE).read_bytes()
        certgen.load_ca(ca_cert_pem, ca_key_pem)
    except (OSError, CertificateError):
        return None
    if needs_renewal(ca_cert_pem, now=now, before=RENEW_BEFORE):
        return None
    return ca_cert_pem, ca_key_pem
