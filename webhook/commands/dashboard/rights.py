"""Whose rights the dashboard acts with, and whether they allow a button, as the API server
says before anyone presses it.

- `who`: a SelfSubjectReview (authentication.k8s.io v1, served from Kubernetes 1.28; v1beta1
  on 1.27; v1alpha1 before, where enabled), made with the user's own connection; where the
  server has none (1.20), the user and context the kubeconfig names, said as such. Asked once.
- `may_update`: a SelfSubjectAccessReview (authorization.k8s.io/v1) of `patch`, then `update`,
  of that ConfigMap or Secret in its namespace: the verbs (approve, pause, resume) try a patch,
  then a read and a replace (`webhook.commands.changes.ask_admission`). Either allowed: the
  button may be pressed. Each answer is kept `ttl` seconds (`TTL`) per (namespace, kind, name),
  so the page of a change, drawn again whenever the cluster moves, costs the API server at most
  two reviews per source and `ttl`.
- `refused`: the API server's refusal of a press, kept as that source's answer for `ttl`.

The dashboard decides nothing from them: a press is the verb's own request, which the API
server admits or refuses."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from cachetools import TTLCache

from webhook.core.model import SourceKind
from webhook.kube.errors import KubeError
from webhook.kube.raw import Kube

TTL: Final = 10.0  # seconds an answer is kept
KEPT_MOST: Final = 4096  # sources whose answer is kept (a page shows a few)
ACCESS_REVIEW: Final = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
# The SelfSubjectReview of each version the API server may serve, newest first.
SUBJECT_REVIEWS: Final = tuple(
    (f"authentication.k8s.io/{v}", f"/apis/authentication.k8s.io/{v}/selfsubjectreviews")
    for v in ("v1", "v1beta1", "v1alpha1")
)
VERBS: Final = ("patch", "update")


@dataclass(frozen=True)
class Who:
    """The user the dashboard acts as: `user` as the API server names them (`reviewed`) or as
    the kubeconfig does."""

    user: str
    groups: tuple[str, ...] = ()
    reviewed: bool = False
    context: str = ""

    def named(self) -> str:
        """The user, in a sentence: as the API server names them, or as the kubeconfig does."""
        if self.reviewed:
            return self.user
        return f"user {self.user or '?'} of your kubeconfig"

    def as_dict(self) -> dict[str, Any]:
        if self.reviewed:
            said = "as the API server names you (SelfSubjectReview)"
        else:
            said = (
                "as your kubeconfig names you"
                + (f" (context {self.context})" if self.context else "")
                + ": this API server answers no SelfSubjectReview (Kubernetes 1.28 does)"
            )
        return {"user": self.user or "?", "groups": list(self.groups), "reviewed": self.reviewed,
                "said": said}  # fmt: skip


@dataclass(frozen=True)
class May:
    """Whether the user may press a button of a source: True, False (`why`, in words), or
    None (the API server could not be asked: `why`; a press asks it)."""

    allowed: bool | None
    why: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"allowed": self.allowed, "why": self.why}


class Rights:
    """`kube`: the user's own connection; `user`, `context`: as the kubeconfig names them;
    `ttl`: seconds an answer is kept (`TTL`)."""

    def __init__(
        self,
        kube: Kube,
        user: str = "",
        context: str = "",
        clock: Callable[[], float] = time.monotonic,
        ttl: float = TTL,
    ) -> None:
        self.kube = kube
        self.fallback = Who(user, context=context)
        self.clock = clock
        self._who: Who | None = None
        self._answers: TTLCache[tuple[str, str, str], May] = TTLCache(KEPT_MOST, ttl, clock)
        self._lock = threading.Lock()  # (a cachetools cache is not thread-safe)

    def who(self) -> Who:
        """Who the API server says the user is; the kubeconfig's names where it cannot say
        (kept once known; asked again after a connection error)."""
        if self._who is not None:
            return self._who
        for version, api_path in SUBJECT_REVIEWS:
            body = {"apiVersion": version, "kind": "SelfSubjectReview"}
            try:
                answer = self.kube.create(api_path, body)
            except KubeError as e:
                if e.status is None:
                    return self.fallback  # (unreachable: asked again)
                continue  # not served (404), or not allowed: the next, then the kubeconfig
            info = (answer.get("status") or {}).get("userInfo") or {}
            if isinstance(info.get("username"), str) and info["username"]:
                groups = tuple(str(g) for g in info.get("groups") or ())
                self._who = Who(info["username"], groups, reviewed=True)
                return self._who
        self._who = self.fallback
        return self._who

    def may_update(self, kind: SourceKind, namespace: str, name: str) -> May:
        key = (namespace, kind.value, name)
        with self._lock:
            kept = self._answers.get(key)
        if kept is not None:
            return kept
        may = self._ask(kind, namespace, name)
        if may.allowed is not None:  # (not asked: asked again next time)
            with self._lock:
                self._answers[key] = may
        return may

    def refused(self, kind: SourceKind, namespace: str, name: str, message: str) -> None:
        """The API server refused a press: its answer stands for the source for `ttl`."""
        with self._lock:
            self._answers[(namespace, kind.value, name)] = May(False, message)

    def _ask(self, kind: SourceKind, namespace: str, name: str) -> May:
        what = f"{kind.api_kind} {namespace}/{name}"
        said = []
        for verb in VERBS:
            attributes = {"namespace": namespace, "verb": verb, "resource": kind.resource,
                          "name": name}  # fmt: skip
            body = {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attributes},
            }
            try:
                status = self.kube.create(ACCESS_REVIEW, body).get("status") or {}
            except KubeError as e:
                return May(None, f"could not ask the API server whether you may update {what}: {e}")
            if status.get("allowed") is True:
                return May(True)
            for text in (status.get("reason"), status.get("evaluationError")):
                if isinstance(text, str) and text and text not in said:
                    said.append(text)
        why = f"your rights ({self.who().named()}) do not allow updating {what}"
        return May(False, why + (f" (the API server said: {'; '.join(said)})" if said else ""))
