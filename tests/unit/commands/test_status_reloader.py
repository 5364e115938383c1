"""`configpin status` says a workload is left to Stakater Reloader where the controller leaves
it (webhook.core.reloader), naming the annotation and what lets configpin roll it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.conftest import container, env_cm, pod_spec, workload
from webhook.commands.status import SourceStatus, StatusReader, WorkloadStatus
from webhook.core.model import SourceId
from webhook.core.reasons import Status


class _Reader(StatusReader):
    def __init__(self, said: dict[str, dict[str, Any] | None]) -> None:
        super().__init__(None)  # type: ignore[arg-type]  # (nothing read but the sources)
        self.said = said

    def source_annotations(self, namespace: str, sid: SourceId) -> dict[str, Any] | None:
        return self.said.get(str(sid), {})


def _judged(
    annotations: dict[str, str],
    said: dict[str, dict[str, Any] | None] | None = None,
    sources: list[SourceStatus] | None = None,
) -> WorkloadStatus:
    obj = workload(
        "Deployment", pod_spec(container(env=[env_cm("cfg", "a")])), annotations=annotations
    )
    st = WorkloadStatus("team-a", "Deployment", "app", state=Status.STALE)
    st.sources = sources or [SourceStatus("configmap/cfg", "a" * 64, "b" * 64)]
    _Reader(said or {})._reloader(obj, st)
    return st


def test_a_change_reloader_rolls_it_for_is_said_left_to_reloader() -> None:
    st = _judged({"reloader.stakater.com/auto": "true"})
    assert st.state is Status.LEFT_TO_RELOADER
    assert "reloader.stakater.com/auto on the workload" in st.reason
    assert "remove Reloader's annotation to let configpin roll" in st.reason
    assert Status.LEFT_TO_RELOADER.exit_code == 1  # (not delivered yet)


@pytest.mark.parametrize(
    ("annotations", "said", "sources"),
    [
        ({}, None, None),  # no Reloader annotation
        ({"reloader.stakater.com/auto": "true"}, {"configmap/cfg": None}, None),  # unreadable
        (
            {"reloader.stakater.com/auto": "true"},
            {"configmap/cfg": {"reloader.stakater.com/ignore": "true"}},
            None,
        ),
        (  # a source that appeared is configpin's
            {"reloader.stakater.com/auto": "true"},
            None,
            [SourceStatus("configmap/cfg", None, "b" * 64)],
        ),
    ],
)
def test_otherwise_it_stays_stale(
    annotations: dict[str, str],
    said: dict[str, dict[str, Any] | None] | None,
    sources: list[SourceStatus] | None,
) -> None:
    assert _judged(annotations, said, sources).state is Status.STALE
