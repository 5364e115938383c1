"""What a stale workload waits for, as the controller last decided: what the ConfigRollout of
a source it is stale for says of it (webhook.core.rollouts: the gate's answer, published),
else the controller's last Event about it (whose reason gives the state:
reasons.WAIT_STATES). Read with the user's own rights; what they may not read says nothing.
`configpin status` asks it for every stale workload, one read per source and run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from webhook.core.model import SourceId, SourceKind
from webhook.core.reasons import WAIT_STATES, Status
from webhook.core.rollouts import member_wait, rollout_name, rollout_path
from webhook.kube.errors import KubeError
from webhook.kube.raw import Kube, path


class Waits:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._rollouts: dict[tuple[str, str], dict[str, Any] | None] = {}

    def of(self, obj: dict[str, Any], stale: Sequence[str] = ()) -> tuple[Status | None, str]:
        """The state and the words of why `obj` waits (`stale`: the sources it is stale for,
        `configmap/NAME`); (None, "") when neither the ConfigRollouts nor the Events say."""
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "")
        kind, name = str(obj.get("kind")), str(meta.get("name"))
        for source in stale:
            found = self.rollout(namespace, source)
            said = member_wait(found, kind, name) if found is not None else None
            if said is not None:
                return said
        return self.event(obj)

    def rollout(self, namespace: str, source: str) -> dict[str, Any] | None:
        """The ConfigRollout of `source` (`configmap/NAME`) in `namespace`; None where there is
        none, or the user may not read it."""
        kind, _, name = source.partition("/")
        try:
            sid = SourceId(SourceKind(kind), name)
        except ValueError:
            return None
        key = (namespace, source)
        if key not in self._rollouts:
            try:
                found: dict[str, Any] | None = self.kube.get(
                    rollout_path(namespace, rollout_name(sid.kind, sid.name))
                )
            except KubeError:
                found = None
            self._rollouts[key] = found
        return self._rollouts[key]

    def event(self, obj: dict[str, Any]) -> tuple[Status | None, str]:
        """What the controller's last Event about `obj` that says a wait says."""
        meta = obj.get("metadata") or {}
        selector = f"involvedObject.name={meta.get('name')}"
        try:
            page = self.kube.get(
                path("events", str(meta.get("namespace") or ""), prefix="/api/v1"),
                fieldSelector=selector,
            )
        except KubeError:
            return None, ""  # not allowed to read Events, say: the state stays stale
        notes = sorted(
            (
                str(e.get("lastTimestamp") or e.get("eventTime") or ""),
                WAIT_STATES[str(e.get("reason"))],
                str(e.get("message") or ""),
            )
            for e in page.get("items") or ()
            if (e.get("involvedObject") or {}).get("kind") == obj.get("kind")
            and e.get("reason") in WAIT_STATES
        )
        return (notes[-1][1], notes[-1][2]) if notes else (None, "")
