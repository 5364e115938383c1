"""Certificates for the webhook's HTTPS endpoint: a small CA and a serving certificate.

The API server calls the webhook through its Service, so the serving certificate must name
every form of the Service's DNS name, and the CA goes into the webhook configuration's
`caBundle`. Keys are ECDSA P-256: small, fast handshakes, accepted by every API server.

Reading and checking certificates takes only the standard library (a short DER reader for the
few fields configpin looks at, OpenSSL through `ssl` for keys and signatures); making one
imports cryptography (`webhook.tls.certgen`), which a server that already has its certificate
never loads.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import re
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

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


# ---- reading certificates: the fields configpin looks at, from the DER --------------------


@dataclass(frozen=True)
class CertInfo:
    """One certificate: its DER and what configpin reads from it."""

    der: bytes
    serial: int
    subject: str  # RFC 4514, most specific attribute first, as `openssl x509 -subject` shows
    not_after: datetime
    dns_names: tuple[str, ...]  # subjectAltName dNSName entries

    @property
    def pem(self) -> bytes:
        return ssl.DER_cert_to_PEM_cert(self.der).encode("ascii")

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.der).hexdigest()


_PEM_CERT: Final = re.compile(
    rb"-----BEGIN CERTIFICATE-----\s*(.*?)\s*-----END CERTIFICATE-----", re.DOTALL
)


def read_certificates(pem: bytes) -> list[CertInfo]:
    """Every certificate of a PEM bundle, in order; CertificateError when there is none or one
    cannot be read."""
    blocks = _PEM_CERT.findall(pem)
    if not blocks:
        raise CertificateError("certificate is not valid PEM: no certificate found")
    out = []
    for block in blocks:
        try:
            der = base64.b64decode(b"".join(block.split()), validate=True)
            out.append(_read_der(der))
        except (ValueError, binascii.Error, IndexError, UnicodeDecodeError) as e:
            raise CertificateError(f"certificate is not valid PEM: {e}") from None
    return out


def needs_renewal(cert_pem: bytes, *, now: datetime, before: timedelta) -> bool:
    """True when the certificate expires within `before` of `now`, or cannot be parsed."""
    try:
        cert = read_certificates(cert_pem)[0]
    except CertificateError:
        return True
    return now + before >= cert.not_after


def check_pair(cert_pem: bytes, key_pem: bytes) -> None:
    """Check that a PEM certificate chain can be read and that the private key belongs to its
    first certificate (OpenSSL loads them as a server would). CertificateError otherwise,
    with a message that never contains key material."""
    read_certificates(cert_pem)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        with private_files(cert_pem, key_pem) as (cert_path, key_path):
            ctx.load_cert_chain(cert_path, key_path, password=no_password)
    except ssl.SSLError as e:
        # The reason is OpenSSL's ("KEY_VALUES_MISMATCH", "PEM lib"), never the key bytes.
        if "KEY_VALUES_MISMATCH" in str(e):
            raise CertificateError("private key does not match the certificate") from None
        raise CertificateError("private key is not a valid unencrypted PEM key") from None


def no_password() -> bytes:
    # An encrypted key fails to load instead of OpenSSL asking for a password on the terminal.
    return b""


@contextlib.contextmanager
def private_files(*blobs: bytes) -> Iterator[list[str]]:
    """Paths to files holding `blobs`, readable only by this process, gone afterwards."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None and os.path.isdir("/proc/self/fd"):
        # Anonymous memory files: the key never touches a disk.
        fds = []
        try:
            for blob in blobs:
                fd = memfd_create("configpin-tls", os.MFD_CLOEXEC)
                fds.append(fd)
                view = memoryview(blob)
                while view:
                    view = view[os.write(fd, view) :]
            yield [f"/proc/self/fd/{fd}" for fd in fds]
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="configpin-tls-") as tmp:  # created 0700
        paths = []
        for i, blob in enumerate(blobs):
            path = Path(tmp) / f"{i}.pem"
            path.touch(mode=0o600)
            path.write_bytes(blob)
            paths.append(str(path))
        yield paths


def _tlv(der: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """The DER element at `pos`: (tag, first content byte, end of content)."""
    if pos + 2 > end:
        raise ValueError("truncated DER")
    tag, length = der[pos], der[pos + 1]
    pos += 2
    if length & 0x80:
        size = length & 0x7F
        if not 0 < size <= 4 or pos + size > end:
            raise ValueError("bad DER length")
        length = int.from_bytes(der[pos : pos + size], "big")
        pos += size
    if pos + length > end:
        raise ValueError("truncated DER")
    return tag, pos, pos + length


def _children(der: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    out = []
    while start < end:
        element = _tlv(der, start, end)
        out.append(element)
        start = element[2]
    return out


def _oid(raw: bytes) -> str:
    if not raw:
        raise ValueError("empty OID")
    first = min(raw[0] // 40, 2)
    arcs = [first, raw[0] - 40 * first]
    value = 0
    for byte in raw[1:]:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            arcs.append(value)
            value = 0
    return ".".join(map(str, arcs))


def _time(tag: int, raw: bytes) -> datetime:
    text = raw.decode("ascii")
    if tag == 0x17:  # UTCTime, YYMMDDHHMMSSZ: years 50-99 are 19xx (RFC 5280)
        parsed = datetime.strptime(text, "%y%m%d%H%M%SZ")
        if parsed.year >= 2050:
            parsed = parsed.replace(year=parsed.year - 100)
    elif tag == 0x18:  # GeneralizedTime, YYYYMMDDHHMMSSZ
        parsed = datetime.strptime(text, "%Y%m%d%H%M%SZ")
    else:
        raise ValueError(f"unexpected time tag {tag:#x}")
    return parsed.replace(tzinfo=UTC)


# RFC 4514 short names, as cryptography's `rfc4514_string` and OpenSSL print them
_ATTRIBUTE_NAMES: Final = {
    "2.5.4.3": "CN",
    "2.5.4.6": "C",
    "2.5.4.7": "L",
    "2.5.4.8": "ST",
    "2.5.4.9": "STREET",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "0.9.2342.19200300.100.1.1": "UID",
    "0.9.2342.19200300.100.1.25": "DC",
}
_STRING_CODECS: Final = {0x1E: "utf-16-be", 0x1C: "utf-32-be", 0x14: "latin-1"}


def _name(der: bytes, start: int, end: int) -> str:
    rdns = []
    for _set, s, e in _children(der, start, end):
        attributes = []
        for _seq, a, b in _children(der, s, e):
            (_, os_, oe), (vtag, vs, ve) = _children(der, a, b)[:2]
            oid = _oid(der[os_:oe])
            value = der[vs:ve].decode(_STRING_CODECS.get(vtag, "utf-8"), "replace")
            attributes.append(f"{_ATTRIBUTE_NAMES.get(oid, oid)}={_escape(value)}")
        rdns.append("+".join(attributes))
    return ",".join(reversed(rdns))


def _escape(value: str) -> str:
    value = re.sub(r'([\\"+,;<>])', r"\\\1", value).replace("\0", "\\00")
    if value.startswith(("#", " ")):
        value = "\\" + value
    if value.endswith(" "):
        value = value[:-1] + "\\ "
    return value


_SUBJECT_ALT_NAME: Final = b"\x55\x1d\x11"  # 2.5.29.17


def _read_der(der: bytes) -> CertInfo:
    """Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signature } (RFC 5280)."""
    _, start, end = _tlv(der, 0, len(der))
    _, tbs_start, tbs_end = _tlv(der, start, end)
    fields = _children(der, tbs_start, tbs_end)
    if fields and fields[0][0] == 0xA0:  # [0] version
        fields = fields[1:]
    serial, _algorithm, _issuer, validity, subject, _key, *optional = fields
    if serial[0] != 0x02 or validity[0] != 0x30 or subject[0] != 0x30:
        raise ValueError("not an X.509 certificate")
    _, not_after = _children(der, validity[1], validity[2])[:2]
    dns_names: list[str] = []
    for tag, s, e in optional:
        if tag != 0xA3:  # [3] extensions
            continue
        (_, es, ee) = _tlv(der, s, e)
        for _ext, xs, xe in _children(der, es, ee):
            parts = _children(der, xs, xe)
            if der[parts[0][1] : parts[0][2]] != _SUBJECT_ALT_NAME:
                continue
            _, vs, ve = parts[-1]  # extnValue, an OCTET STRING holding GeneralNames
            _, gs, ge = _tlv(der, vs, ve)
            dns_names += [
                der[ns:ne].decode("ascii")
                for ntag, ns, ne in _children(der, gs, ge)
                if ntag == 0x82
            ]
    return CertInfo(
        der=der[:end],
        serial=int.from_bytes(der[serial[1] : serial[2]], "big", signed=True),
        subject=_name(der, subject[1], subject[2]),
        not_after=_time(not_after[0], der[not_after[1] : not_after[2]]),
        dns_names=tuple(dns_names),
    )


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
