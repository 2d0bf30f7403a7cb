"""Which part an actor plays in its job, from its class name and `ray.actor_roles`: in an RL run,
generator (rollout and inference engines, RLlib's EnvRunners), trainer (learners, Ray Train's
workers), reference, reward or critic model. The `actor_role` label is a function of the
`actor_class` label, so it adds no series."""

from __future__ import annotations

import re
from collections.abc import Mapping

NO_ROLE = ""
_CACHE_LIMIT = 1024  # distinct actor class names remembered; class names are few, this only bounds them


class ActorRoles:
    def __init__(self, patterns: Mapping[str, str]) -> None:
        self._patterns = [(role, re.compile(pattern)) for role, pattern in patterns.items()]
        self._known: dict[str, str] = {}

    def of(self, actor_class: str) -> str:
        """The first role whose pattern is found in `actor_class`; NO_ROLE for none or no class."""
        role = self._known.get(actor_class)
        if role is None:
            role = next((name for name, pattern in self._patterns if actor_class and pattern.search(actor_class)),
                        NO_ROLE)
            if len(self._known) >= _CACHE_LIMIT:
                self._known.clear()
            self._known[actor_class] = role
        return role
