"""The fence of a local web server that acts with the user's cluster credentials.

A page on any site the user visits can make the browser send requests to
`http://127.0.0.1:3100`; it cannot read the answers (no CORS headers are ever sent), but a
request that changes something does not need to be read to do harm, and a DNS name that an
attacker points at 127.0.0.1 after the page loaded (DNS rebinding) makes the browser treat
the dashboard as that site's own origin. So, for every request:

- `Host` must name this server: `localhost` or an IP address it answers on, with its port.
  A DNS name (other than localhost) is refused whatever it resolves to: that is what
  defeats rebinding.
- An `Origin` (sent by browsers with every cross-origin request and every POST) must be this
  server's own; `Sec-Fetch-Site: cross-site` or `same-site` is refused, except for a person
  following a link to the page itself (a top-level navigation, which reads nothing).
- Every request that changes something (POST: approve; preview, which changes nothing but
  sends a manifest) carries the token that only the served page knows (a `<meta>` of the
  page, read by its script: never in a JSON answer, a URL or a cookie), as a header a form
  cannot set, with `Content-Type: application/json`, which a cross-origin page cannot send
  without a preflight that is never allowed.

And every answer carries a strict Content-Security-Policy (scripts and styles from this server
only, no inline script or style, nothing framed or framing, no other origin contacted).

Pure: `Fence.refusal` takes the method, path and headers and says why not (None: allowed).
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

TOKEN_HEADER: Final = "X-Configpin-Token"
READS: Final = frozenset({"GET", "HEAD"})
CHANGES: Final = frozenset({"POST"})

CSP: Final = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    )
)

# Sent with every answer.
HEADERS: Final[Mapping[str, str]] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class Refusal:
    status: int
    why: str


def _split_host(value: str) -> tuple[str, int] | None:
    """(host, port) of a Host or Origin authority; None when it is not one."""
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep:
            return None
        if not rest:
            return host, 80
        if not rest.startswith(":"):
            return None
        port_text = rest[1:]
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep:
            return value, 80
    if not port_text.isdigit() or len(port_text) > 5:
        return None
    return host, int(port_text)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Fence:
    """Who may talk to the server bound at `address`:`port`, and the page's `token`."""

    address: str
    port: int
    token: str

    def host_allowed(self, value: str) -> bool:
        """A Host (or an Origin's authority) that names this server."""
        found = _split_host(value.strip().lower())
        if found is None:
            return False
        host, port = found
        if port != self.port:
            return False
        if host == "localhost":
            return True
        ip = _ip(host)
        if ip is None:
            return False  # a DNS name: whatever it resolves to now, it may not later
        bound = _ip(self.address)
        if bound is None:  # (bound by name: localhost)
            return ip.is_loopback
        if bound.is_unspecified:  # every address of the machine, as the user asked
            return True
        return ip == bound or (bound.is_loopback and ip.is_loopback)

    def origin_allowed(self, origin: str) -> bool:
        scheme, sep, authority = origin.partition("://")
        return (
            bool(sep)
            and scheme == "http"
            and "/" not in authority
            and (self.host_allowed(authority))
        )

    def refusal(self, method: str, path: str, headers: Mapping[str, str]) -> Refusal | None:
        """Why the request is refused (None: it is not). `headers`: names in lower case."""
        host = headers.get("host")
        if not host or not self.host_allowed(host):
            return Refusal(421, "this server answers only requests to its own address")
        if method not in READS | CHANGES:
            return Refusal(405, f"{method} is not served")
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin):
            return Refusal(403, "cross-origin request refused")
        site = headers.get("sec-fetch-site")
        if site in ("cross-site", "same-site"):
            navigating = (
                method in READS
                and headers.get("sec-fetch-mode") == "navigate"
                and not path.startswith("/api/")
            )
            if not navigating:
                return Refusal(403, "cross-origin request refused")
        if method in CHANGES:
            given = headers.get(TOKEN_HEADER.lower(), "")
            if not given or not secrets.compare_digest(given.encode(), self.token.encode()):
                return Refusal(403, "missing or wrong token: reload the page")
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype != "application/json":
                return Refusal(415, "a change is sent as application/json")
        return None
