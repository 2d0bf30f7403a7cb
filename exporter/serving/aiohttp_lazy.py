"""Import aiohttp without two loads it makes at import that `exporter serve` does not need.

- The CA store: `aiohttp.connector` builds its two default client SSL contexts (verified and not) when
  imported, and each loads the system's CA bundle: ~2 MB of RSS in all, in every exporter, though most
  never open an HTTPS connection (the Ray dashboard is plain HTTP unless configured otherwise). Here the
  contexts are the same objects with the same settings, and each loads the CA store
  (`set_default_verify_paths`, what `load_default_certs` does on Linux) the first time it wraps a
  connection or is asked for its CAs; that first HTTPS connection then reads the bundle from disk (~10
  ms) where aiohttp would have read it at import.
- The system's MIME types: `aiohttp.web_fileresponse` makes a `mimetypes.MimeTypes()`, which makes the
  `mimetypes` module read /etc/mime.types into its module-level tables (~0.35 MB of Python objects, ~0.8
  MB of RSS) though the instance itself holds only Python's built-in table. Here the module's tables are
  left to `mimetypes`' own lazy initialisation (its functions call `init()` when first used), as they
  were before aiohttp was imported; the instance is the same.

Imported by `exporter.cli` before anything that imports aiohttp; when aiohttp is already imported it does
nothing.
"""

from __future__ import annotations

import mimetypes
import ssl
import sys
import threading
from typing import Any

_load_lock = threading.Lock()


class DeferredCAContext(ssl.SSLContext):
    """An SSLContext whose CA store is loaded when the context is first used; then a plain SSLContext again."""

    def _load_ca(self) -> None:
        with _load_lock:
            if type(self) is DeferredCAContext:
                ssl.SSLContext.set_default_verify_paths(self)
                self.__class__ = ssl.SSLContext

    def set_default_verify_paths(self) -> None:
        self._load_ca()

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        self._load_ca()
        return ssl.SSLContext.wrap_socket(self, *args, **kwargs)

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        self._load_ca()
        return ssl.SSLContext.wrap_bio(self, *args, **kwargs)

    def get_ca_certs(self, *args: Any, **kwargs: Any) -> Any:
        self._load_ca()
        return ssl.SSLContext.get_ca_certs(self, *args, **kwargs)

    def cert_store_stats(self) -> dict[str, int]:
        self._load_ca()
        return ssl.SSLContext.cert_store_stats(self)


def import_aiohttp() -> list[ssl.SSLContext]:
    """Import aiohttp, deferring the CA loads of the contexts it makes meanwhile (returned) and the
    MIME types' initialisation."""
    if "aiohttp.connector" in sys.modules:
        return []
    importer = threading.get_ident()
    deferred: list[ssl.SSLContext] = []
    own = ssl.SSLContext.__dict__.get("set_default_verify_paths")
    inherited = ssl.SSLContext.set_default_verify_paths

    def defer(self: ssl.SSLContext) -> None:
        if threading.get_ident() == importer and type(self) is ssl.SSLContext:
            deferred.append(self)
        else:  # another thread's context, or a subclass: as usual
            inherited(self)

    ssl.SSLContext.set_default_verify_paths = defer  # type: ignore[method-assign]
    mimetypes_inited = mimetypes.inited
    mimetypes.inited = True  # MimeTypes() then leaves init() to the first call that needs it
    try:
        import aiohttp
        import aiohttp.connector
        import aiohttp.web_fileresponse  # noqa: F401
    finally:
        if not mimetypes_inited and mimetypes._db is None:  # nobody initialised it meanwhile
            mimetypes.inited = False
        if own is None:
            del ssl.SSLContext.set_default_verify_paths
        else:  # pragma: no cover - not so in CPython's ssl module
            ssl.SSLContext.set_default_verify_paths = own  # type: ignore[method-assign]
    for context in deferred:
        context.__class__ = DeferredCAContext
    return deferred


import_aiohttp()
