"""configpin's own errors over the client's: raised `from` the original, never carrying bodies."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import urllib3
from kubernetes.client.exceptions import ApiException


class KubeError(Exception):
    """A cluster call failed."""

    def __init__(self, what: str, status: int | None, reason: str) -> None:
        super().__init__(f"{what}: {status or ''} {reason}".strip())
        self.what = what
        self.status = status
        self.reason = reason


class NotFound(KubeError):
    pass


class Forbidden(KubeError):
    """403: RBAC, or an admission plugin (Pod Security, a policy) refused the request."""


class Conflict(KubeError):
    """409: someone else wrote first (resourceVersion precondition), or it already exists."""


class AlreadyExists(Conflict):
    pass


class Gone(KubeError):
    """410: the resourceVersion is too old; relist."""


class Invalid(KubeError):
    pass


_BY_STATUS: dict[int, type[KubeError]] = {
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
}


@contextlib.contextmanager
def translate(what: str) -> Iterator[None]:
    """Turn client exceptions into KubeError subclasses. The response body is not kept: it
    can echo the object, Secret values included."""
    try:
        yield
    except ApiException as e:
        cls = _BY_STATUS.get(e.status or 0, KubeError)
        if e.status == 409 and "AlreadyExists" in str(e.body or ""):
            cls = AlreadyExists
        raise cls(what, e.status, str(e.reason or "")) from None
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise KubeError(what, None, type(e).__name__) from e
