"""TLS and basic auth from a Prometheus exporter-toolkit style web config file.

    tls_server_config:
      cert_file: server.crt            # paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional mTLS
      client_ca_file: ca.crt
      min_version: TLS12
    basic_auth_users:
      prometheus: $2y$10$...           # bcrypt hash, e.g. from `htpasswd -nBC 10 "" | tr -d ':\\n'`

A subset of exporter-toolkit's format: settings we do not implement are refused by name rather
than silently ignored.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import bcrypt
from aiohttp import web
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from exporter.config import ConfigError, format_validation_error, read_yaml_file
from exporter.strict import Strict

_TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                 "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
TLSVersionName = Literal["TLS10", "TLS11", "TLS12", "TLS13"]
_UNSUPPORTED = {
    "tls_server_config": ("cipher_suites", "curve_preferences", "prefer_server_cipher_suites",
                          "client_allowed_sans", "cert", "key"),
    "": ("http_server_config", "rate_limit"),
}


class _Strict(Strict):
    model_config = ConfigDict(frozen=True)


class TLSServerConfig(_Strict):
    cert_file: Path
    key_file: Path
    client_auth_type: Literal["NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"] = \
        "NoClientCert"
    client_ca_file: Path | None = None
    min_version: TLSVersionName = "TLS12"
    max_version: TLSVersionName | None = None

    @model_validator(mode="after")
    def _ca_for_client_auth(self) -> TLSServerConfig:
        if self.client_auth_type != "NoClientCert" and self.client_ca_file is None:
            raise ValueError(f"client_auth_type {self.client_auth_type} needs client_ca_file")
        return self


class WebConfig(_Strict):
    tls_server_config: TLSServerConfig | None = None
    basic_auth_users: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for section, keys in _UNSUPPORTED.items():
                scope = data.get(section) if section else data
                for key in keys:
                    if isinstance(scope, dict) and key in scope:
                        where = f"{section}.{key}" if section else key
                        raise ValueError(f"{where} is an exporter-toolkit setting raypulse does not support; "
                                         "remove it")
        return data

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt_hashes(cls, users: dict[str, str]) -> dict[str, str]:
        for user, hashed in users.items():
            if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")) or len(hashed) != 60:
                raise ValueError(f"user {user!r}: the password must be a bcrypt hash ($2y$10$..., 60 "
                                 "characters), e.g. from `htpasswd -nBC 10 \"\" | tr -d ':\\n'`")
        return users


def load_web_config(path: Path) -> WebConfig:
    """Read and validate; relative file paths are resolved against the config file's folder."""
    data = read_yaml_file(path, "web config file")
    try:
        config = WebConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, [(f"web config file {path}", data)])) from None
    tls = config.tls_server_config
    if tls is not None:
        base = path.parent
        resolved = {name: (base / value if value is not None and not value.is_absolute() else value)
                    for name, value in (("cert_file", tls.cert_file), ("key_file", tls.key_file),
                                        ("client_ca_file", tls.client_ca_file))}
        config = config.model_copy(update={"tls_server_config": tls.model_copy(update=resolved)})
        try:
            ssl_context(config.tls_server_config)  # unreadable certificates fail now, not at bind time
        except ConfigError as exc:
            raise ConfigError(f"web config file {path}: {exc}") from None
    return config


def ssl_context(tls: TLSServerConfig) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _TLS_VERSIONS[tls.min_version]
    if tls.max_version:
        context.maximum_version = _TLS_VERSIONS[tls.max_version]
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls_server_config.cert_file/key_file ({tls.cert_file}, {tls.key_file}): "
                          f"cannot load the certificate and key: {exc}") from None
    if tls.client_auth_type != "NoClientCert":
        try:
            context.load_verify_locations(cafile=tls.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"tls_server_config.client_ca_file ({tls.client_ca_file}): cannot load: {exc}") from None
        context.verify_mode = (ssl.CERT_REQUIRED if tls.client_auth_type == "RequireAndVerifyClientCert"
                               else ssl.CERT_OPTIONAL)
    return context


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes, caching verdicts (bcrypt is slow)."""

    _CACHE_LIMIT = 1024

    def __init__(self, users: dict[str, str]) -> None:
        self._users = {user: hashed.encode() for user, hashed in users.items()}
        self._cache: dict[bytes, bool] = {}
        self._cache_key = os.urandom(16)
        # Unknown users still pay for one bcrypt check, so timing does not reveal who exists.
        self._dummy_hash = bcrypt.hashpw(b"raypulse", bcrypt.gensalt(rounds=10))

    async def allows(self, header: str | None) -> bool:
        credentials = _parse_basic(header)
        if credentials is None:
            return False
        user, password = credentials
        key = hmac.new(self._cache_key, user.encode() + b"\0" + password.encode(), hashlib.sha256).digest()
        verdict = self._cache.get(key)
        if verdict is None:
            hashed = self._users.get(user)
            verdict = await asyncio.to_thread(bcrypt.checkpw, password.encode(), hashed or self._dummy_hash)
            verdict = verdict and hashed is not None
            if len(self._cache) >= self._CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = verdict
        return verdict

    def middleware(self) -> Callable[..., Awaitable[web.StreamResponse]]:
        @web.middleware
        async def require_basic_auth(request: web.Request,
                                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                                     ) -> web.StreamResponse:
            if not await self.allows(request.headers.get("Authorization")):
                return web.Response(status=401, text="Unauthorized\n",
                                    headers={"WWW-Authenticate": 'Basic realm="raypulse exporter"'})
            return await handler(request)

        return require_basic_auth


def _parse_basic(header: str | None) -> tuple[str, str] | None:
    if not header or not header.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None
