"""An answer against its model (pydantic), every field of the answer declared by the model:
the typed API's check (issue 40), shared by the unit tests (answers built by the service's
code) and the live tests (answers as the API sends them)."""

from __future__ import annotations

from typing import Any, get_origin

from pydantic import BaseModel


def undeclared(model: type[BaseModel], data: Any, at: str = "") -> list[str]:
    """The keys of `data` (nested through models and lists of models) `model` does not declare."""
    if not isinstance(data, dict):
        return []
    out = [f"{at}{k}" for k in data if k not in model.model_fields]
    for name, f in model.model_fields.items():
        inner = _model_of(f.annotation)
        value = data.get(name)
        if inner is None:
            continue
        if get_origin(f.annotation) is dict and isinstance(value, dict):  # a map of models
            items = list(value.values())
        else:
            items = value if isinstance(value, list) else [value]
        items = [x for i in items for x in (i if isinstance(i, list) else [i])]  # a map of lists
        for item in items:
            out += undeclared(inner, item, f"{at}{name}.")
    return out


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def described(model: type[BaseModel], data: dict[str, Any]) -> None:
    model.model_validate(data)
    assert undeclared(model, data) == [], f"{model.__name__} lacks {undeclared(model, data)}"
