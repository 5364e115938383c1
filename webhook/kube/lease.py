"""A `coordination.k8s.io/v1` Lease as a leader-election lock.

The official Python client ships only a ConfigMap lock, so this is client-go's
`resourcelock.LeaseLock` in plain dicts: read the record, and write it back with the
resourceVersion it was read at, so that two candidates cannot both win (the loser gets 409).
The election itself (when to acquire, renew, give up) lives in `webhook.controller.leader`.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, replace
from typing import Any, Final

import urllib3

from webhook.core.model import JSONObject
from webhook.kube.errors import AlreadyExists, Conflict, NotFound
from webhook.kube.raw import Kube, path

_MICROTIME: Final = "%Y-%m-%dT%H:%M:%S.%fZ"


def format_time(when: datetime.datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339, microseconds, UTC)."""
    return when.astimezone(datetime.UTC).strftime(_MICROTIME)


def parse_time(text: Any) -> datetime.datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What a Lease says about its holder (client-go's `LeaderElectionRecord`)."""

    holder: str
    duration_seconds: int
    acquire_time: datetime.datetime | None
    renew_time: datetime.datetime | None
    transitions: int
    resource_version: str = ""

    def same_claim(self, other: LeaseRecord | None) -> bool:
        """Whether `other` says the same as this record (resourceVersion aside)."""
        return other is not None and replace(other, resource_version="") == replace(
            self, resource_version=""
        )


def duration_seconds(seconds: float) -> int:
    """leaseDurationSeconds is an integer: round up, never below one second."""
    return max(1, math.ceil(seconds))


def _record(obj: JSONObject) -> LeaseRecord:
    spec = obj.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=parse_time(spec.get("acquireTime")),
        renew_time=parse_time(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str((obj.get("metadata") or {}).get("resourceVersion") or ""),
    )


def _spec(record: LeaseRecord) -> JSONObject:
    spec: JSONObject = {
        "holderIdentity": record.holder,
        "leaseDurationSeconds": record.duration_seconds,
        "leaseTransitions": record.transitions,
    }
    if record.acquire_time is not None:
        spec["acquireTime"] = format_time(record.acquire_time)
    if record.renew_time is not None:
        spec["renewTime"] = format_time(record.renew_time)
    return spec


class LeaseLock:
    """Read and write one Lease. Every write is conditional on the record last read."""

    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name

    def describe(self) -> str:
        return f"lease {self.namespace}/{self.name}"

    def get(self, *, timeout: float) -> LeaseRecord | None:
        """The current record; None when the Lease does not exist."""
        try:
            return _record(
                self.kube.request(
                    "GET", path("leases", self.namespace, self.name), timeout=_total(timeout)
                )
            )
        except NotFound:
            return None

    def create(self, record: LeaseRecord, *, timeout: float) -> LeaseRecord | None:
        """Create the Lease holding `record`; None when someone created it first."""
        body: JSONObject = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": _spec(record),
        }
        try:
            return _record(
                self.kube.request(
                    "POST", path("leases", self.namespace), body=body, timeout=_total(timeout)
                )
            )
        except AlreadyExists:
            return None

    def update(self, record: LeaseRecord, *, timeout: float) -> LeaseRecord | None:
        """Replace the record, on condition that the Lease is still at
        `record.resource_version`; None when someone else wrote it in between."""
        body: JSONObject = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": record.resource_version,
            },
            "spec": _spec(record),
        }
        try:
            return _record(
                self.kube.request(
                    "PUT",
                    path("leases", self.namespace, self.name),
                    body=body,
                    timeout=_total(timeout),
                )
            )
        except (Conflict, NotFound):
            return None


def _total(seconds: float) -> urllib3.Timeout:
    """A bound on the whole request, not only on each socket operation."""
    return urllib3.Timeout(total=seconds)
