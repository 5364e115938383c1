"""Mutated AdmissionReviews (Hypothesis): whatever a field holds, never an internal error.

A review of every workload kind, with every kind of reference, has one to three of its fields
replaced by arbitrary JSON (or removed). Each is answered as the server would: 400 for what
is not an AdmissionReview, else an admission response; never "failed internally", never an
exception. Derandomized: every run checks the same examples.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.conftest import (
    HKEY,
    WORKLOAD_KINDS,
    configmap,
    container,
    env_cm,
    env_secret,
    envfrom_cm,
    pod_spec,
    proj_cm,
    proj_secret,
    review,
    secret,
    vol_cm,
    vol_projected,
    vol_secret,
    workload,
)
from webhook.core.model import JSONObject
from webhook.inputs.sources import FileSources
from webhook.process.metrics import Metrics
from webhook.server.admission import BadReview, parse_review
from webhook.server.handler import Admitter

SOURCES = [configmap("cfg", {"a": "1", "b": "2"}), secret("creds", {"user": "u"})]


def _spec() -> JSONObject:
    return pod_spec(
        container(
            env=[env_cm("cfg", "a"), env_secret("creds", "user"), {"name": "PLAIN", "value": "1"}],
            env_from=[envfrom_cm("cfg", optional=True)],
        ),
        init=[container("init", env=[env_cm("missing", "k", optional=True)])],
        volumes=[
            vol_cm("cfg", items=["b"]),
            vol_secret("creds"),
            vol_projected(proj_cm("cfg"), proj_secret("creds", items=["user"])),
        ],
    )


BASES: list[JSONObject] = []
for _kind in WORKLOAD_KINDS:
    _obj = workload(_kind, _spec(), annotations={"configpin.io/mode": "checksum"})
    BASES.append(review(_obj))
    BASES.append(review(_obj, operation="UPDATE", old=copy.deepcopy(_obj)))

# Values of every JSON type, scalars and containers alike, so that a mutated field mostly
# changes its type (null is legal almost everywhere and would mostly test nothing).
scalars = st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False)
json_values = st.one_of(
    scalars,
    st.text(max_size=8),
    st.lists(scalars | st.text(max_size=4), max_size=3),
    st.dictionaries(st.text(max_size=6), scalars | st.text(max_size=4), max_size=3),
    st.none(),
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for key, child in items:
        out.append((*prefix, key))
        out.extend(_paths(child, (*prefix, key)))
    return out


def _mutate(doc: JSONObject, path: tuple[Any, ...], value: Any, remove: bool) -> None:
    here: Any = doc
    for part in path[:-1]:
        here = here[part]
    if remove and isinstance(here, dict):
        del here[path[-1]]
    else:
        here[path[-1]] = value


@pytest.fixture(scope="module")
def admitter() -> Admitter:
    return Admitter(hkey=HKEY, sources=FileSources(HKEY, SOURCES), metrics=Metrics())


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_mutated_reviews_never_fail_internally(admitter: Admitter, data: st.DataObject) -> None:
    body = copy.deepcopy(data.draw(st.sampled_from(BASES)))
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(body)
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        _mutate(body, path, data.draw(json_values), data.draw(st.booleans()))
    try:
        parsed = parse_review(orjson.dumps(body))
    except BadReview:
        return  # answered 400
    out = asyncio.run(admitter.review(parsed))
    response = out["response"]
    assert response["uid"] == parsed.uid
    assert not any("internally" in w for w in response.get("warnings", [])), response
    for warning in response.get("warnings", []):
        assert "Traceback" not in warning
    errors = admitter.metrics.registry.get_sample_value(
        "configpin_admissions_total",
        {"kind": parsed.kind, "operation": parsed.operation, "result": "error"},
    )
    assert errors is None, response
