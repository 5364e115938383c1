"""The admission metrics counted on the event loop (Tally, LoopHistogram) expose exactly what
prometheus_client's Counter and Histogram expose for the same observations."""

from __future__ import annotations

import re
import threading
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from webhook.process.metrics import AdmissionResult, LoopCounts, LoopHistogram, Metrics

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def _exposed(registry: CollectorRegistry) -> str:
    # creation times differ between the two registries: compared without their values
    return re.sub(r"(_created(\{[^}]*\})?) \S+", r"\1 T", generate_latest(registry).decode())


@settings(max_examples=60, deadline=None)
@given(
    amounts=st.lists(
        st.one_of(
            st.sampled_from(BUCKETS),  # exactly on a bound: counted in that bucket
            st.floats(min_value=0, max_value=10, allow_nan=False),
        ),
        max_size=40,
    ),
    labels=st.lists(st.sampled_from(["a", "b", "c"]), max_size=40),
)
def test_loop_metrics_expose_what_prometheus_client_does(
    amounts: list[float], labels: list[str]
) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    counts = LoopCounts()
    ours.register(counts)
    hist = Histogram("x_seconds", "doc", buckets=BUCKETS, registry=theirs)
    loop_hist = LoopHistogram("x_seconds", "doc", BUCKETS, ours)
    counter = Counter("y_total", "doc", ["l"], registry=theirs)
    loop_counter = Counter("y_total", "doc", ["l"], registry=ours)
    tallies = {}
    for amount in amounts:
        hist.observe(amount)
        loop_hist.observe(amount)
    for i, label in enumerate(labels):
        counter.labels(label).inc()
        if label not in tallies:
            tallies[label] = counts.tally(loop_counter.labels(label))
        tallies[label].inc()
        if i % 7 == 3:  # read in between: folding twice never counts twice
            generate_latest(ours)
    assert _exposed(ours) == _exposed(theirs)


def test_tallies_are_folded_before_their_counter_is_read_from_another_thread() -> None:
    metrics = Metrics()
    tally = metrics.loop_counts.tally(metrics.admissions.labels("Pod", "CREATE", "patched"))
    stop = threading.Event()
    done = 0

    def loop() -> None:  # the one thread that counts
        nonlocal done
        while not stop.is_set() and done < 200_000:
            tally.inc()
            done += 1

    thread = threading.Thread(target=loop)
    thread.start()
    seen = []
    for _ in range(50):
        seen.append(
            metrics.registry.get_sample_value(
                "configpin_admissions_total",
                {"kind": "Pod", "operation": "CREATE", "result": "patched"},
            )
        )
    stop.set()
    thread.join()
    assert seen == sorted(seen)  # never less than before, never counted twice
    final = metrics.registry.get_sample_value(
        "configpin_admissions_total", {"kind": "Pod", "operation": "CREATE", "result": "patched"}
    )
    assert final == done


def test_the_admission_results_are_the_label_values_dashboards_read() -> None:
    """configpin_admissions_total's `result` label comes from one enum, its values those
    configpin has always exposed, each documented for operators."""
    assert sorted(AdmissionResult) == sorted(
        ["patched", "unchanged", "skipped", "ignored", "out-of-scope", "denied", "invalid", "error"]
    )
    operations = (Path(__file__).parents[3] / "docs" / "operations.md").read_text()
    [row] = [line for line in operations.splitlines() if "`configpin_admissions_total{" in line]
    assert all(f"`{result}`" in row for result in AdmissionResult), row
