"""A person scales members of a change to zero in the middle of it (shared/SPEC.md "Safe
delivery under what people and tools do": a workload of a wave that is scaled to zero proves
nothing, it leaves the wave), over the controller as `configpin serve` builds it.

Under waves 1,approve,100%, the two members that wait for the change's approval are scaled to
zero: they wait for the approval still, and once it is approved they take the content with no
pod to restart, their rollout recorded as left. (Before, with the canary the only member left
that vouches, they were cut into its wave, before the approval, and took content nobody
approved: they would have started with it when scaled up again.)"""

from __future__ import annotations

import copy

from harness.builders import HKEY
from tests.unit.controller.test_limits import CFG, NS, _source, _wait_of, _World
from webhook.controller.outcome import Rolled, Settled
from webhook.core import digest
from webhook.core.audit import APPROVED, ChangedBy
from webhook.core.constants import ANN_APPROVED
from webhook.core.current import WorkloadEntry
from webhook.core.model import SourceKind
from webhook.core.record import Change, State, rollout_record
from webhook.core.waves import WaitReason


def _scaled_to_zero(world: _World, name: str) -> None:
    """`kubectl scale --replicas=0`, as the API server stores it and its watch indexes it."""
    obj = world.server.objects[world.path(name)]
    obj["spec"]["replicas"] = 0
    obj["metadata"]["generation"] += 1
    obj["status"] = {"observedGeneration": obj["metadata"]["generation"], "replicas": 0}
    world.server.put(world.path(name), obj)
    entry = world.ctl.restamper.entry(copy.deepcopy(obj))
    assert isinstance(entry, WorkloadEntry)
    world.ctl.index.put(entry)


def _approved(world: _World, value: str, change: Change) -> None:
    """`cfg` (holding `value`) as admission stores it once `configpin approve` approved
    `change`'s content: the signed approval record, as its watch sees it."""
    source = _source(value)
    record = ChangedBy("rm@example.com", 1_800_000_000.0, change.content)
    source["metadata"]["annotations"] = {
        ANN_APPROVED: record.encode(HKEY, NS, CFG, domain=APPROVED)
    }
    world.ctl.cache.indexes[SourceKind.CONFIGMAP].event("MODIFIED", source)
    assert world.ctl.gate.cut.approved(NS, change)


def test_members_scaled_to_zero_while_they_await_approval_await_it_still() -> None:
    world = _World(["w0", "w1", "w2"], waves="1,approve,100%")
    change = world.change("2")
    [[canary], later] = world.ctl.gate.cut.plan(change)
    assert len(later) == 2
    assert isinstance(world.reconcile(canary.name), Rolled)
    done = world.progress(canary.name, ready=True)
    assert isinstance(done, Settled) and done.state == "complete"
    for ref in later:
        assert _wait_of(world.reconcile(ref.name)).reason is WaitReason.APPROVAL

    patched = {ref.name: world.patches(ref.name) for ref in later}
    for ref in later:
        _scaled_to_zero(world, ref.name)
    for ref in later:  # no pods: they vouch for nothing, and still wait for the approval
        wait = _wait_of(world.reconcile(ref.name))
        assert wait.reason is WaitReason.APPROVAL and (wait.wave, wait.waves) == (2, 2), wait
    assert {ref.name: world.patches(ref.name) for ref in later} == patched  # (nothing rolled)

    _approved(world, "2", change)
    template = digest.source_digest(
        digest.namespace_key(HKEY, NS),
        digest.record_from_object(HKEY, CFG.kind, _source("2")),
        frozenset({"a"}),
    )
    for ref in later:
        assert isinstance(world.reconcile(ref.name), Rolled)
        stored = world.server.objects[world.path(ref.name)]
        record = rollout_record(HKEY, stored)
        assert record is not None and record.state is State.LEFT, record  # (no pod restarted)
        assert (
            template
            in stored["spec"]["template"]["metadata"]["annotations"]["configpin.io/sources"]
        )
        assert stored["spec"]["replicas"] == 0
