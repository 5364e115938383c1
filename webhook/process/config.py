"""Settings: each flag of `configpin serve` is also an environment variable CONFIGPIN_<NAME>.
Flags and variables are flat (`--rollout-waves`, CONFIGPIN_ROLLOUT_WAVES); the code reads them
by group, parsed (`settings.rollout.waves`, `settings.server.port`): the groups are in groups.py."""

from __future__ import annotations

import inspect
import json
import os
from typing import Any, Final, get_origin

from pydantic import model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from webhook.process.groups import (
    Admission,
    Certificates,
    Cluster,
    Controller,
    Group,
    Logging,
    Rollout,
    Server,
    Snapshots,
    Workloads,
)


class Settings(BaseSettings):
    """Made from flag names, `Settings(rollout_waves="off")`, and the environment
    (CONFIGPIN_ROLLOUT_WAVES); a flag wins over the environment. Each group is validated, its
    texts parsed, once, here: a wrong value is refused naming its flag."""

    model_config = SettingsConfigDict(env_prefix="CONFIGPIN_", extra="forbid", frozen=True)

    # in the order --help and docs/settings.md show them
    cluster: Cluster
    admission: Admission
    snapshots: Snapshots
    workloads: Workloads
    rollout: Rollout
    controller: Controller
    server: Server
    certs: Certificates
    logging: Logging

    def __init__(self, **flags: Any) -> None:
        super().__init__(**flags)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _FlagVariables(settings_cls)

    @model_validator(mode="before")
    @classmethod
    def _into_groups(cls, data: Any) -> Any:
        """Each flag into its group; a name that is no flag is left for extra="forbid"."""
        if not isinstance(data, dict):
            return data
        grouped: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
        rest: dict[str, Any] = {}
        for name, value in data.items():
            if name in _GROUP_OF:
                grouped[_GROUP_OF[name]][name] = value
            elif name in GROUPS:  # (a group is given by its flags)
                raise ValueError(
                    f"{name}: not a flag; its flags: {', '.join(flags_of(GROUPS[name]))}"
                )
            else:
                rest[name] = value
        return rest | grouped

    @model_validator(mode="after")
    def _snapshot_mode_needs_snapshots(self) -> Settings:
        if self.admission.mode == "snapshot" and not self.snapshots.enabled:
            raise ValueError("--mode snapshot needs snapshots allowed (--snapshots)")
        return self


class _FlagVariables(PydanticBaseSettingsSource):
    """CONFIGPIN_<FLAG> of each flag, whichever group holds it (a list's takes JSON)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # (read by flag in __call__, not by group)

    def __call__(self) -> dict[str, Any]:
        variables = {k.upper(): v for k, v in os.environ.items()}
        found: dict[str, Any] = {}
        for field, info in FIELDS.items():
            text = variables.get(env_name(field))
            if text is None:
                continue
            if get_origin(info.annotation) is list:
                try:
                    found[field] = json.loads(text)
                except ValueError:
                    found[field] = text  # refused as "not a valid list", naming the flag
            else:
                found[field] = text
        return found


def flags_of(group: type[Group]) -> dict[str, FieldInfo]:
    """A group's fields by flag field name (`rollout_waves`, its alias, for `waves`)."""
    return {info.alias or name: info for name, info in group.model_fields.items()}


def _group(info: FieldInfo) -> type[Group]:
    assert isinstance(info.annotation, type) and issubclass(info.annotation, Group)
    return info.annotation


GROUPS: Final[dict[str, type[Group]]] = {
    name: _group(info) for name, info in Settings.model_fields.items()
}
FIELDS: Final[dict[str, FieldInfo]] = {
    field: info for group in GROUPS.values() for field, info in flags_of(group).items()
}
_GROUP_OF: Final[dict[str, str]] = {
    field: name for name, group in GROUPS.items() for field in flags_of(group)
}


def flag_of(loc: tuple[int | str, ...]) -> str | None:
    """The flag field an error's location names (("rollout", "rollout_waves"): rollout_waves)."""
    if len(loc) > 1 and loc[0] in GROUPS and loc[1] in FIELDS:
        return str(loc[1])
    return None


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def env_name(field: str) -> str:
    return "CONFIGPIN_" + field.upper()


def default_text(field: str) -> str:
    """The default of a setting as a user reads it (`--help`, docs/settings.md)."""
    info = FIELDS[field]
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if extra.get("default_text"):
        return str(extra["default_text"])
    value = info.get_default(call_default_factory=True)
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def settings_markdown() -> str:
    """docs/settings.md's settings tables, one per group, made from the model (a test keeps
    the page equal)."""
    tables = []
    for group in GROUPS.values():
        rows = [f"### {group.title}", "", inspect.cleandoc(group.__doc__ or ""), ""]
        rows += ["| flag | environment | default | meaning |", "|---|---|---|---|"]
        for field, info in flags_of(group).items():
            flag = flag_name(field)
            if info.annotation is bool:
                flag = f"{flag}/--no-{flag[2:]}"
            rows.append(
                f"| `{flag}` | `{env_name(field)}` | `{default_text(field)}` | {info.description} |"
            )
        tables.append("\n".join(rows) + "\n")
    return "\n".join(tables)
