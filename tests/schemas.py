"""Kubernetes schemas as `kubectl apply --validate=strict` reads them, for the manifest tests."""

from __future__ import annotations

from typing import Any


def strict(schema: Any) -> Any:
    """The schema with unknown fields forbidden wherever it lists the known ones (the API server
    would prune them silently; `kubectl apply --validate=strict` refuses them)."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema
