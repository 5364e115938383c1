"""A server TLS context that picks up a renewed certificate without a restart.

cert-manager or the kubelet replace the mounted Secret; the listening socket keeps one
`ssl.SSLContext` for its whole life, and OpenSSL copies the certificate into each new
connection when it is accepted. So reloading means calling `load_cert_chain` again on that
same context: handshakes from then on present the new certificate, established
connections keep the old one until they close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from webhook.tls.certs import CertificateError, check_pair, private_files, read_certificates
from webhook.tls.ciphers import DEFAULT_CIPHER_SUITES, openssl_ciphers

logger = logging.getLogger(__name__)

# (resolved path, device, inode, mtime_ns, size) of each watched file.
_FileId = tuple[str, int, int, int, int]


class _ChangedWhileReading(Exception):
    pass


@dataclass(frozen=True)
class _Material:
    cert_pem: bytes
    key_pem: bytes
    client_ca_pem: bytes | None


class ReloadingTLSContext:
    """Owns one live server `SSLContext` and reloads its certificate when the files change.

    The first load happens in the constructor and raises on a bad certificate or key
    (OSError or CertificateError): without one there is nothing to serve. Later reloads
    never raise and never leave the context without a working pair.

    With `client_ca_file`, clients must present a certificate signed by that CA. OpenSSL
    can only add to a live trust store, so a reloaded client CA is trusted in addition to
    the earlier one; removing a CA needs a restart.
    """

    def __init__(
        self,
        cert_file: Path,
        key_file: Path,
        *,
        client_ca_file: Path | None = None,
        cipher_suites: Sequence[str] = DEFAULT_CIPHER_SUITES,
    ) -> None:
        self._cert_file = Path(cert_file)
        self._key_file = Path(key_file)
        self._client_ca_file = None if client_ca_file is None else Path(client_ca_file)

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        # TLS 1.2 suites only; OpenSSL keeps its TLS 1.3 suites (all AEAD) apart.
        try:
            ctx.set_ciphers(openssl_ciphers(cipher_suites))
        except ssl.SSLError as e:
            raise ValueError(f"no usable TLS cipher suite among {list(cipher_suites)}") from e
        # Only HTTP/1.1 is served; saying so lets a client that offers h2 settle at once.
        ctx.set_alpn_protocols(["http/1.1"])
        if self._client_ca_file is not None:
            ctx.verify_mode = ssl.CERT_REQUIRED
        self._context = ctx

        material = self._read_settled()
        check_pair(material.cert_pem, material.key_pem)
        self._apply(material)
        self._loaded = material
        self._last_failure: str | None = None
        logger.info("Loaded TLS certificate %s", _describe(material.cert_pem))

    @property
    def context(self) -> ssl.SSLContext:
        """The live context: hand it to the server once; reloads change it in place."""
        return self._context

    def maybe_reload(self) -> bool:
        """Reload the certificate if the files changed; True if a new one is now served.

        A Secret volume is updated by writing a new `..<timestamp>` directory and
        atomically repointing the `..data` symlink, so the files are read through their
        resolved paths, and a read during which any resolved path or inode changed is
        discarded. The content is compared, not timestamps: a file rewritten in place
        twice within one clock tick keeps its mtime. A read that races a swap, or a
        certificate that does not match its key, keeps the current pair and is tried
        again on the next call.
        """
        try:
            material = self._read(self._file_ids())
        except _ChangedWhileReading:
            self._failed("certificate files changed while being read; retrying on the next poll")
            return False
        except OSError as e:
            self._failed(f"cannot read the certificate files: {e}")
            return False
        if material == self._loaded:
            self._last_failure = None
            return False

        try:
            check_pair(material.cert_pem, material.key_pem)
        except CertificateError as e:
            self._failed(f"new certificate not loaded, keeping the current one: {e}")
            return False

        try:
            self._apply(material)
        except (ssl.SSLError, OSError, ValueError) as e:
            # OpenSSL may have taken the new certificate and dropped the old key before
            # failing; put the last good pair back so handshakes keep working.
            self._apply(self._loaded)
            self._failed(f"new certificate rejected by OpenSSL, keeping the current one: {e}")
            return False

        self._loaded = material
        self._last_failure = None
        logger.info("Reloaded TLS certificate %s", _describe(material.cert_pem))
        return True

    async def watch(self, interval: float = 2.0) -> None:
        """Poll for changed certificate files until cancelled.

        The reload runs on the event loop's own thread on purpose: OpenSSL does not allow
        changing a context while another thread creates connections from it, and reading
        a few kilobytes every couple of seconds does not stall the loop.
        """
        while True:
            await asyncio.sleep(interval)
            try:
                self.maybe_reload()
            except Exception:
                logger.exception("TLS certificate reload failed unexpectedly; still watching")

    def _paths(self) -> list[Path]:
        paths = [self._cert_file, self._key_file]
        if self._client_ca_file is not None:
            paths.append(self._client_ca_file)
        return paths

    def _file_ids(self) -> tuple[_FileId, ...]:
        ids = []
        for path in self._paths():
            resolved = os.path.realpath(path)
            st = os.stat(resolved)
            ids.append((resolved, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(ids)

    def _read(self, file_ids: tuple[_FileId, ...]) -> _Material:
        # Read the resolved targets, so cert and key come from the same `..data` snapshot,
        # then check nothing moved underneath.
        blobs = [Path(file_id[0]).read_bytes() for file_id in file_ids]
        if self._file_ids() != file_ids:
            raise _ChangedWhileReading
        return _Material(
            cert_pem=blobs[0],
            key_pem=blobs[1],
            client_ca_pem=blobs[2] if len(blobs) > 2 else None,
        )

    def _read_settled(self) -> _Material:
        for _ in range(5):
            with contextlib.suppress(_ChangedWhileReading):
                return self._read(self._file_ids())
        raise OSError("certificate files keep changing while being read")

    def _apply(self, material: _Material) -> None:
        if material.client_ca_pem is not None:
            self._context.load_verify_locations(cadata=material.client_ca_pem.decode("ascii"))
        # load_cert_chain only takes file names; hand it the bytes we validated, not the
        # mounted files, which may have changed again since.
        with private_files(material.cert_pem, material.key_pem) as (cert_path, key_path):
            self._context.load_cert_chain(cert_path, key_path)

    def _failed(self, message: str) -> None:
        # A broken Secret would otherwise log the same warning every poll.
        level = logging.DEBUG if message == self._last_failure else logging.WARNING
        logger.log(level, "TLS reload: %s", message)
        self._last_failure = message


def _describe(cert_pem: bytes) -> str:
    """Enough to tell certificates apart in a log: subject, serial, expiry, fingerprint."""
    cert = read_certificates(cert_pem)[0]
    return (
        f"subject={cert.subject} serial={cert.serial:x} "
        f"not_after={cert.not_after.isoformat()} sha256={cert.sha256[:16]}"
    )
