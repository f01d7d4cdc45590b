"""Base classes for flexlease's pydantic models (frozen values, camelCase on the wire)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class KubeModel(BaseModel):
    """A frozen value that reads and writes Kubernetes-style camelCase JSON.

    Python attributes are snake_case; ``model_dump(by_alias=True)`` gives camelCase keys.
    Unknown keys are ignored on input so newer writers do not break older readers.
    """

    model_config = ConfigDict(
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        use_enum_values=False,
    )

    def to_json_obj(self) -> dict[str, object]:
        """The object as JSON-ready camelCase dict, omitting ``None`` fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
