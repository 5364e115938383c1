"""Objects read as their metadata only (meta.k8s.io/v1 PartialObjectMetadata): a Secret's data
never leaves the API server for what needs only its annotations (`configpin status` and
`configpin migrate` asking what a source says to Stakater Reloader)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from webhook.core.model import JSONObject
from webhook.kube.raw import Kube

META_ONE: Final = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
META_LIST: Final = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


class _Metadata(Kube):
    def __init__(self, kube: Kube, accept: str) -> None:
        super().__init__(kube.api)
        self.accept = accept

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = super()._headers(content_type)
        headers["Accept"] = self.accept
        return headers


def get_metadata(kube: Kube, api_path: str) -> JSONObject:
    """One object, its metadata only."""
    return _Metadata(kube, META_ONE).get(api_path)


def list_metadata(kube: Kube, api_path: str, **query: Any) -> Iterator[JSONObject]:
    """Every object of a list, metadata only, page by page."""
    for page in _Metadata(kube, META_LIST).list_pages(api_path, **query):
        yield from page.get("items") or ()
