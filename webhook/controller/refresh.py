"""on-change: refresh: tell a workload's running pods to sync their mounted volumes now.

One annotation per pod, `configpin.io/refreshed`, which also says what the pod was handed.
Pods are patched before the workload records the refresh, so a restart or a new leader finds
them done, never the record ahead of them. A pod that consumes a changed source otherwise than
the template (an older revision during a rollout) is left to that rollout. Each patch waits
for the controller's shared rate limit, as its workload writes do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from webhook.controller.restamp import plan_update
from webhook.core.constants import ANN_REFRESHED, ANN_SOURCES, ON_CHANGE_REFRESH
from webhook.core.current import Lookup, WorkloadRef
from webhook.core.kept import dumps_mapping, parse_mapping
from webhook.core.kinds import template_paths
from webhook.core.model import JSONObject, SourceId
from webhook.core.refs import consumption, find_sites, get_path, unrefreshable
from webhook.kube.errors import Forbidden
from webhook.kube.pods import annotate_pod, workload_pods
from webhook.kube.ratelimit import LimitedKube
from webhook.kube.raw import Kube
from webhook.process.config import Settings
from webhook.process.metrics import Metrics

log = logging.getLogger(__name__)

_POD_WRITERS: Final = 8  # pod patches in flight at once, every refresh together (and rate limited)


class NotLeading(Exception):
    """Leadership was lost in the middle of a workload's pods."""


def _pod_spec(kind: str, obj: JSONObject) -> JSONObject:
    paths = template_paths(kind)
    assert paths is not None
    spec = get_path(obj, paths[1])
    return spec if isinstance(spec, dict) else {}


class Pods:
    """The running pods of workloads, as the controller refreshes them."""

    def __init__(
        self,
        kube: Kube,
        limited: LimitedKube,
        hkey: bytes,
        settings: Settings,
        metrics: Metrics,
        *,
        is_leader: Callable[[], bool],
    ) -> None:
        self.kube = kube  # lists pods
        self.limited = limited  # patches them, within the controller's rate limit
        self.hkey = hkey
        self.settings = settings
        self.metrics = metrics
        self.is_leader = is_leader
        self._writers = ThreadPoolExecutor(_POD_WRITERS, thread_name_prefix="refresh")

    def close(self) -> None:
        self._writers.shutdown(wait=False, cancel_futures=True)

    def running(self, ref: WorkloadRef, obj: JSONObject) -> list[JSONObject]:
        """The workload's live pods (its rollout is followed by theirs)."""
        return workload_pods(self.kube, ref.kind, obj)

    def lagging(
        self, ref: WorkloadRef, obj: JSONObject, target: Mapping[str, str]
    ) -> list[JSONObject]:
        """The live pods of the workload that a refresh to `target` (the per-source digests
        of what its volumes now hold) reaches and that do not have it yet."""
        text = dumps_mapping(target)
        wanted = consumption(find_sites(_pod_spec(ref.kind, obj)))
        lagging: list[JSONObject] = []
        for pod in workload_pods(self.kube, ref.kind, obj):
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            if annotations.get(ANN_REFRESHED) == text:
                continue
            base = (
                parse_mapping(annotations.get(ANN_REFRESHED))
                or parse_mapping(annotations.get(ANN_SOURCES))
                or {}
            )
            changed: set[SourceId] = set()
            for key, value in target.items():
                if base.get(key) != value:
                    try:
                        changed.add(SourceId.parse(key))
                    except ValueError:
                        continue
            if not changed:
                continue
            spec = pod.get("spec") or {}
            has = consumption(find_sites(spec))
            if unrefreshable(spec, changed) or any(
                sid not in has or sid not in wanted or has[sid].keys != wanted[sid].keys
                for sid in changed
            ):
                continue
            lagging.append(pod)
        return lagging

    def refresh(self, ref: WorkloadRef, obj: JSONObject, target: Mapping[str, str]) -> int:
        """Annotate each lagging pod with `target`; returns the pods patched. Raises
        Forbidden (the first pod alone is tried first) and NotLeading."""
        lagging = self.lagging(ref, obj, target)
        text = dumps_mapping(target)

        def annotate(pod: JSONObject) -> int:
            if not self.is_leader():
                raise NotLeading(f"{ref}: leadership lost while refreshing its pods")
            if not annotate_pod(self.limited, pod, ANN_REFRESHED, text):
                return 0
            self.metrics.pods_refreshed.inc()
            return 1

        if not lagging:
            return 0
        # The first alone: a 403 (the permission withheld) is known before any other is sent.
        # The rest on the few pod writers (shared by every workload being refreshed, so that
        # at most _POD_WRITERS are in flight whatever the fan-out): one workload's pods go
        # faster than one round trip after another, and many workloads do not pile up in
        # the API server's queues.
        patched = annotate(lagging[0])
        if len(lagging) > 1:
            patched += sum(self._writers.map(annotate, lagging[1:]))
        return patched

    def catch_up(self, ref: WorkloadRef, obj: JSONObject, read: Lookup) -> None:
        """A current workload that was refreshed: pods created since (a scale-up, a replaced
        pod) start with the content it was refreshed to, not its template's older record;
        their annotation is brought to it. What is written is planned here from the sources,
        never taken from the workload's own (tenant-writable) record."""
        plan = plan_update(obj, ref, self.hkey, self.settings, read)
        if plan.skipped is not None or plan.on_change != ON_CHANGE_REFRESH:
            return
        try:
            n = self.refresh(ref, obj, plan.observed)
        except Forbidden as e:
            log.warning("%s: its new pods cannot be marked refreshed: %s", ref, e)
            return
        if n:
            log.info("%s: %d pods created since its last refresh marked refreshed", ref, n)
