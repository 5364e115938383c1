"""The workloads webhook refuses a workload write that sets its rollout windows or budget to
a value that cannot be read (`configpin.io/rollout-windows`, `configpin.io/rollout-budget`),
with a message that names the annotation: through the app as the API server calls it, and
for a large review decided in the worker process."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.conftest import container, env_cm, pod_spec, review, workload
from tests.unit.server.test_http import Server, _server
from webhook.core.constants import ANN_ROLLOUT_BUDGET, ANN_ROLLOUT_WINDOWS
from webhook.core.model import JSONObject

pytestmark = pytest.mark.anyio

SPEC = pod_spec(container(env=[env_cm("cfg", "a")]))
BAD = '[{"kind": "deny", "schedule": "0 22 * * 5", "duration": "60 hours"}]'
GOOD = '[{"kind": "deny", "schedule": "0 22 * * 5", "duration": "60h"}]'


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _deployment(**annotations: str) -> JSONObject:
    return workload("Deployment", SPEC, annotations=annotations)


def _refused(out: dict[str, Any]) -> str:
    resp = out["response"]
    assert resp["allowed"] is False and "patch" not in resp
    assert resp["status"]["code"] == 400 and resp["status"]["reason"] == "BadRequest"
    message: str = resp["status"]["message"]
    return message


async def _answers(server: Server, *bodies: JSONObject) -> list[dict[str, Any]]:
    async with server.client:
        return [await server.admit(body) for body in bodies]


async def test_unreadable_windows_and_budget_are_refused_by_name() -> None:
    windows, budget = await _answers(
        _server(),
        review(_deployment(**{ANN_ROLLOUT_WINDOWS: BAD})),
        review(_deployment(**{ANN_ROLLOUT_BUDGET: "6"})),
    )
    assert _refused(windows) == (
        "configpin.io/rollout-windows: window 1: duration '60 hours': unknown unit ' hours' "
        "(ns us ms s m h)"
    )
    assert _refused(budget) == (
        "configpin.io/rollout-budget: '6': COUNT/PERIOD expected (6/1h), or 0 for none"
    )


async def test_readable_values_are_admitted_and_pinned_as_usual() -> None:
    [out] = await _answers(
        _server(), review(_deployment(**{ANN_ROLLOUT_WINDOWS: GOOD, ANN_ROLLOUT_BUDGET: "2/30s"}))
    )
    assert out["response"]["allowed"] is True and "patch" in out["response"]


async def test_a_value_an_update_leaves_as_it_was_is_admitted() -> None:
    held = _deployment(**{ANN_ROLLOUT_WINDOWS: BAD})
    changed = _deployment(**{ANN_ROLLOUT_WINDOWS: BAD.replace("60", "6")})
    fixed = _deployment(**{ANN_ROLLOUT_WINDOWS: GOOD})
    kept, refused, mended = await _answers(
        _server(),
        review(held, operation="UPDATE", old=held),
        review(changed, operation="UPDATE", old=held),
        review(fixed, operation="UPDATE", old=held),
    )
    assert kept["response"]["allowed"] is True
    assert _refused(refused).startswith("configpin.io/rollout-windows: window 1: duration")
    assert mended["response"]["allowed"] is True


async def test_outside_configpin_s_namespaces_nothing_is_refused() -> None:
    [out] = await _answers(
        _server(in_scope=lambda _ns: False), review(_deployment(**{ANN_ROLLOUT_WINDOWS: BAD}))
    )
    assert out["response"] == {"uid": out["response"]["uid"], "allowed": True}


async def test_a_large_review_is_refused_as_a_small_one() -> None:
    """Decided in the worker process (the serving process holds a stub of the objects): the
    annotations it checks travel with the stub."""
    heavy = _server(heavy_body=0)
    try:
        refused, admitted = await _answers(
            heavy,
            review(_deployment(**{ANN_ROLLOUT_WINDOWS: BAD})),
            review(_deployment(**{ANN_ROLLOUT_WINDOWS: GOOD})),
        )
    finally:
        heavy.admitter.close()
    assert _refused(refused).startswith("configpin.io/rollout-windows: window 1: duration")
    assert admitted["response"]["allowed"] is True and "patch" in admitted["response"]
    assert heavy.metrics.registry.get_sample_value("configpin_heavy_reviews_total") == 2
