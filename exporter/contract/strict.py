"""The base of every model a person writes for raypulse (job spec, exporter config, web config, GPU
control file, progress reports), and one way of telling them what is wrong with it.

`Strict` refuses unknown fields (a typo is an error, never a silent default); a model that must not
change after validation adds `frozen=True` to its own model_config, one that is edited field by
field adds `validate_assignment=True`. `problems()` turns pydantic's errors into (where, message)
pairs with the field's path as a person writes it (`worker_groups[0].cpus`); each caller frames
them for its source (a file, a flag, a request).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

UNKNOWN_FIELD = "unknown field (check the spelling)"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Problem:
    where: str  # the field's path, e.g. worker_groups[0].cpus; "" for the whole document
    message: str
    loc: tuple[str | int, ...]  # pydantic's location (for callers that look the field up)

    def __str__(self) -> str:
        return f"{self.where or '(top level)'}: {self.message}"


def field_path(loc: Iterable[Any]) -> str:
    """`a.b[2].c` from pydantic's location, without the validator steps it inserts."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not str(part).startswith("function-"):
            path += f".{part}" if path else str(part)
    return path


def problems(error: ValidationError, unknown_field: str = UNKNOWN_FIELD) -> list[Problem]:
    """Every problem of a validation error, most specific location first as pydantic gives them.
    A model-level check that names its field first ("address: ...") is put where a field goes."""
    found = []
    for item in error.errors():
        loc = tuple(part for part in item["loc"] if not str(part).startswith("function-"))
        where = field_path(loc)
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = unknown_field
        elif item["type"] == "missing":
            message = "required"
        head = message.split(": ", 1)[0]
        if not where and ": " in message and all(part.isidentifier() for part in head.split(".")):
            where, message = message.split(": ", 1)
        found.append(Problem(where, message, loc))
    return found


def summary(error: ValidationError, unknown_field: str = UNKNOWN_FIELD, whole: str = "(top level)") -> str:
    """The first problem, and how many more there are (for one-line answers such as a 400); `whole`
    names the document when the problem is with all of it."""
    found = problems(error, unknown_field)
    more = len(found) - 1
    return (f"{found[0].where or whole}: {found[0].message}"
            + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""))
