"""The names users see: annotations, labels, modes (the tables of docs/annotations.md, which
tests/unit/project/test_docs.py holds to these). Change them nowhere else."""

from typing import Final

DOMAIN: Final = "configpin.io"

ANN_CHECKSUM: Final = "configpin.io/checksum"
ANN_SOURCES: Final = "configpin.io/sources"
ANN_MODE: Final = "configpin.io/mode"
ANN_IGNORE: Final = "configpin.io/ignore"

LABEL_ENABLED: Final = "configpin.io/enabled"
LABEL_SNAPSHOT: Final = "configpin.io/snapshot"
LABEL_SOURCE: Final = "configpin.io/source"  # on a copy, only where the name fits a label value
ANN_SOURCE: Final = "configpin.io/source"  # on a copy: the source's full name, always
ANN_SIGNATURE: Final = "configpin.io/signature"  # on a copy: proof that configpin made it
# On a copy: the sweep's mark when nothing owns or references it (when it was first found so).
ANN_UNUSED: Final = "configpin.io/unused-since"
MAX_LABEL_VALUE: Final = 63

MODE_CHECKSUM: Final = "checksum"
MODE_SNAPSHOT: Final = "snapshot"
MODE_OFF: Final = "off"
MODES: Final = (MODE_CHECKSUM, MODE_SNAPSHOT, MODE_OFF)

SERVICE_ACCOUNT_TOKEN_TYPE: Final = "kubernetes.io/service-account-token"
HELM_RELEASE_TYPE: Final = "helm.sh/release.v1"  # a Helm release revision: no pod consumes one

# On a workload's own metadata (never the pod template, so writing it rolls nothing): the
# per-source digests the workload was last brought up to date with, by admission or by the
# controller. It differs from the template's `configpin.io/sources` only after a rollback to
# an older snapshot, which the controller must leave alone until the source changes again.
ANN_OBSERVED: Final = "configpin.io/observed"

# On a workload's own metadata: when configpin's controller last rolled it (RFC 3339, UTC).
# The minimum interval between two rollouts counts from here, so it holds across restarts
# and leader changes, not only in the memory of the replica that rolled.
ANN_ROLLED_AT: Final = "configpin.io/rolled-at"

# On a workload's own metadata: "pin" pins a workload that another controller (an operator)
# owns; by default such a workload is left to its owner. Never read on a Pod, nor on a
# workload owned by a kind configpin knows (a Deployment's ReplicaSets, which copy its
# annotations, follow the Deployment's template).
ANN_OWNED: Final = "configpin.io/owned"
OWNED_PIN: Final = "pin"

# On a workload's own metadata: what a change does to it, `roll` (the default: its pod
# template is re-stamped) or `refresh` (its running pods are told to sync their mounted
# volumes now, where the change reaches them only through whole-volume mounts).
ANN_ON_CHANGE: Final = "configpin.io/on-change"
ON_CHANGE_ROLL: Final = "roll"
ON_CHANGE_REFRESH: Final = "refresh"
ON_CHANGE_POLICIES: Final = (ON_CHANGE_ROLL, ON_CHANGE_REFRESH)

# Per-source digests (the JSON of `configpin.io/sources`) of what a refresh handed: on a pod,
# the content it has been refreshed to since it started (its `configpin.io/sources` names the
# template's); on a workload's own metadata, what its pods were last refreshed to. Removed
# from the workload when its pod template is stamped again (new pods start from it).
ANN_REFRESHED: Final = "configpin.io/refreshed"

# Safe delivery. On a workload's own metadata, set by its owner:
#   what configpin does when a rollout it started fails: undo (snapshot mode's default: back
#   to the previous copies), hold (checksum mode's: start nothing more for that change), none
#   (webhook.core.record.Action)
ANN_ON_FAILURE: Final = "configpin.io/on-failure"
#   seconds its updated pods have to be Ready (kinds without a progress deadline of their own)
ANN_PROGRESS_DEADLINE: Final = "configpin.io/progress-deadline"
#   its place in the waves of a change consumed by several workloads (an integer, lower first)
ANN_WAVE: Final = "configpin.io/wave"
# Written by configpin on a workload's own metadata:
#   the config rollout it started there and follows (JSON, signed with the digest key)
ANN_ROLLOUT: Final = "configpin.io/rollout"
#   content a rollout failed with (per-source digests): never rolled to again
ANN_REJECTED: Final = "configpin.io/rejected"
# On a ConfigMap or Secret, set by its owner: "true" makes its changes one change across every
# namespace where a source of that name is so marked and holds the same content (a platform
# ConfigMap copied into each team's namespace): one set of waves for all of them. Otherwise a
# change is its namespace's own: a rollout in one namespace never waits for another's.
ANN_SHARED: Final = "configpin.io/shared"
# Change preview and audit. Written by configpin's admission on a ConfigMap or Secret whose
# content a request changes: who changed it and when, signed with the digest key over the
# source and its content (JSON); a record that does not match is not believed.
ANN_CHANGED_BY: Final = "configpin.io/changed-by"
# On a ConfigMap or Secret in a server-side dry run (`configpin plan`): "request" asks
# admission for the full plan of the change, which it answers in the same annotation of the
# dry run's result (JSON). Never stored: admission removes it from a real write.
ANN_PLAN: Final = "configpin.io/plan"
PLAN_REQUEST: Final = "request"
# Approval (a wave list holding `approve`). On a ConfigMap or Secret: "request", set by
# `configpin approve` with the user's own rights, which admission turns into the signed
# record of who approved its content now (configpin.io/approved, JSON). A newer change of
# the content needs its own approval. "now" (`configpin approve --now`): the same, and the
# record says `now`: the override of an emergency, it rolls whatever its windows and rollout
# budget say.
ANN_APPROVE: Final = "configpin.io/approve"
ANN_APPROVED: Final = "configpin.io/approved"
APPROVE_NOW: Final = "now"
# A person's verb on a change (SPEC, "Acting on a change"). On a ConfigMap or Secret:
# "pause" or "resume", set by `configpin pause` / `configpin resume` with the user's own
# rights, which admission turns into the signed record of who did it, when, and for which
# content (configpin.io/acted, JSON: webhook.core.verbs). A pause holds only the content it
# names: a newer change of the source rolls.
ANN_ACT: Final = "configpin.io/act"
ANN_ACTED: Final = "configpin.io/acted"
# On a workload's own metadata: its own wave list; holding `approve`, its rollout of any
# change waits for that change's approval.
ANN_ROLLOUT_WAVES: Final = "configpin.io/rollout-waves"
APPROVE_STEP: Final = "approve"
# When and how often configpin starts a rollout (SPEC, "Windows and budgets"). On a workload's
# own metadata (the window list also on a Namespace), set by its owner: its rollout windows
# (webhook.core.windows: a JSON or YAML list with the fields of Argo CD's sync windows) and
# its rollout budget (webhook.core.budget: COUNT/PERIOD, or 0). A write that sets either to a
# value that cannot be read is refused at admission.
ANN_ROLLOUT_WINDOWS: Final = "configpin.io/rollout-windows"
ANN_ROLLOUT_BUDGET: Final = "configpin.io/rollout-budget"
# configpin's own signed record on a workload's metadata of when it started its last rollouts
# (webhook.core.budget), read by the rollout budget; a person's edit of it is not believed.
ANN_ROLLOUT_STARTS: Final = "configpin.io/rollout-starts"
# (workload metadata) while configpin holds its change for a person or a clock: "REASON: words",
# what Argo CD's and Flux's health checks read (charts/configpin/files/argocd)
ANN_HELD: Final = "configpin.io/held"
# (workload metadata, set by its owner) "configmap/NAME,secret/NAME": sources its application
# reads itself, which configpin pins and rolls it for as though its pod spec referenced them
# whole (webhook.core.extra)
ANN_EXTRA_SOURCES: Final = "configpin.io/extra-sources"
