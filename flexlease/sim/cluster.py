"""The simulated cluster from a YAML file (``python -m flexlease.sim --cluster FILE``).

    nodes: 32             # general-pool nodes (optional: else --nodes)
    standby_nodes: 2      # standby-pool nodes (optional: else --standby-nodes)
    gpus_per_node: 8      # optional: else --gpus-per-node
    models:               # GPU models (NVML product names) and their shares of the nodes
      - name: NVIDIA H20
        share: 0.7
      - name: NVIDIA H100 80GB HBM3
        share: 0.3
    online_model: NVIDIA H20   # the model the online job asks for (optional: the first)

Validated with pydantic (unknown keys, shares <= 0, a model named twice, an
``online_model`` not among ``models`` are refused); :func:`load` turns every problem into a
:class:`ClusterFileError` naming the file and the field. Shares are normalised to sum to 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

ModelName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


class ClusterFileError(ValueError):
    """A cluster file cannot be read or is invalid; the message names the file and the field."""


class ModelShare(BaseModel):
    """One GPU model and its share of the nodes (> 0; shares need not sum to 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: ModelName
    share: float = Field(gt=0, allow_inf_nan=False)


class ClusterFile(BaseModel):
    """The file's content (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: int | None = Field(default=None, ge=2)
    standby_nodes: int | None = Field(default=None, ge=0)
    gpus_per_node: int | None = Field(default=None, ge=1)
    models: tuple[ModelShare, ...] = Field(min_length=1)
    online_model: ModelName | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ClusterFile:
        names = [m.name for m in self.models]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"models names {', '.join(twice)} more than once")
        if self.online_model is not None and self.online_model not in names:
            raise ValueError(
                f"online_model {self.online_model!r} is not one of the models ({', '.join(names)})"
            )
        return self

    def gpu_models(self) -> tuple[tuple[str, float], ...]:
        """(model, share) with the shares normalised to sum to 1; the online job's model
        first (the simulator's online job asks for the first model)."""
        total = sum(m.share for m in self.models)
        pairs = [(m.name, m.share / total) for m in self.models]
        if self.online_model is not None:
            pairs.sort(key=lambda p: p[0] != self.online_model)
        return tuple(pairs)


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def parse(text: str, *, source: str = "cluster file") -> ClusterFile:
    """Parse and validate YAML ``text``. Raises :class:`ClusterFileError` with ``source``
    and, per problem, the field's path (``models.1.share``) and what is wrong."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ClusterFileError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ClusterFileError(f"{source}: must be a mapping with at least 'models'")
    try:
        return ClusterFile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{_where(e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False, include_context=False)
        )
        raise ClusterFileError(f"{source}: {problems}") from exc


def load(path: Path) -> ClusterFile:
    """Read and validate the cluster file at ``path``. Raises :class:`ClusterFileError`
    (also when the file cannot be read)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ClusterFileError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
    return parse(text, source=str(path))
