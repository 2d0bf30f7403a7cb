"""The Ray auth token, found where Ray itself looks, for `Authorization: Bearer`.

Order as in Ray (doc/source/ray-security/token-auth.md): RAY_AUTH_TOKEN, then the file named
by RAY_AUTH_TOKEN_PATH, then ~/.ray/auth_token. RAY_AUTH_MODE=disabled means send none. Read on
every request (a launcher may write the token after the exporter starts); the file is re-read
only when it changes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

_file_cache: dict[Path, tuple[float, str | None]] = {}


def _read_token_file(path: Path) -> str | None:
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    cached = _file_cache.get(path)
    if cached is None or cached[0] != mtime:
        try:
            cached = (mtime, path.read_text().strip() or None)
        except OSError as exc:
            log.warning("cannot read the Ray auth token file %s: %s", path, exc.strerror)
            cached = (mtime, None)
        _file_cache[path] = cached
    return cached[1]


def ray_auth_token(environ: Mapping[str, str] = os.environ, home: Path | None = None) -> str | None:
    if environ.get("RAY_AUTH_MODE", "").strip().lower() == "disabled":
        return None
    token = environ.get("RAY_AUTH_TOKEN", "").strip()
    if token:
        return token
    if environ.get("RAY_AUTH_TOKEN_PATH"):
        return _read_token_file(Path(environ["RAY_AUTH_TOKEN_PATH"]).expanduser())
    return _read_token_file((home or Path.home()) / ".ray" / "auth_token")
