"""What configpin's webhooks act on: one filter, applied wherever a review is parsed (the
serving process, or the worker process for a large one: server/large.py), never written twice.

It reads a request's envelope (kind, operation, subresource) and whether its objects are
there, never their content. Which webhook answers what it lets through is the handler's
(server/handler.py): the workloads webhook (`/mutate`) plans a workload write, the sources
webhook (`/sources`) previews a source write, and anything else is allowed unchanged.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from webhook.server.admission import Review
from webhook.server.writes import source_kind_of

_WORKLOAD_OPERATIONS: Final = frozenset({"CREATE", "UPDATE"})
_SOURCE_OPERATIONS: Final = frozenset({"UPDATE", "DELETE"})


class Intake(Enum):
    """What a review is to configpin."""

    # A CREATE or UPDATE of an object (not of a subresource), the object carried: planned
    # (the planner leaves kinds it does not pin alone).
    WORKLOAD = "workload"
    # An UPDATE or DELETE of a core ConfigMap or Secret (not of a subresource), its old
    # object carried: previewed, and its editor recorded.
    SOURCE = "source"
    # Anything else (a CREATE of a ConfigMap, a DELETE of a Deployment, a subresource, a
    # CONNECT): allowed unchanged.
    NOTHING = "nothing"


def intake(review: Review) -> Intake:
    """What `review` is (see `Intake`)."""
    if review.request.get("subResource"):
        return Intake.NOTHING
    if source_kind_of(review) is not None:
        if review.operation in _SOURCE_OPERATIONS and review.old is not None:
            return Intake.SOURCE
        return Intake.NOTHING
    if review.operation in _WORKLOAD_OPERATIONS and review.obj is not None:
        return Intake.WORKLOAD
    return Intake.NOTHING
