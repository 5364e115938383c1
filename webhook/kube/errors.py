"""configpin's own errors for cluster calls: never carrying response bodies."""

from __future__ import annotations


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
