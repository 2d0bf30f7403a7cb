"""TLS, basic auth and a request rate limit from a Prometheus exporter-toolkit style web config file.

    tls_server_config:
      cert_file: server.crt            # paths are relative to this file; re-read when they change
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional mTLS
      client_ca_file: ca.crt
      min_version: TLS12
    basic_auth_users:
      prometheus: $2y$12$...           # bcrypt hash, e.g. from `htpasswd -nBC 12 prometheus`
    auth_excluded_paths: [/healthz, /readyz]   # raypulse's own: served without basic auth
    rate_limit: {interval: 100ms, burst: 20}   # a token bucket over every request; 429 when empty

docs/web-config.md has every key and how raypulse differs from exporter-toolkit. What the server
uses: `load_web_config(path)` (refuses a config that cannot work, naming the field and the fix, and
logs what works but is unwise), `ssl_context(tls)` (one SSLContext for the listener, whose
certificate, key and client CA follow their files), and `middlewares(config)` (rate limit, response
headers, client certificate SANs, basic auth). Nothing before the auth verdict raises: a request is
answered 401, 403 or 429, never 500.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import logging
import math
import os
import re
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from exporter import userinput
from exporter.config import ConfigError, format_validation_error, read_yaml_file
from exporter.contract.strict import Strict

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]

_TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                 "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
TLSVersionName = Literal["TLS10", "TLS11", "TLS12", "TLS13"]
ClientAuthType = Literal["NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"]
_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
# exporter-toolkit's client_auth_type values that take a client certificate without verifying it:
# Python's ssl verifies every certificate it asks for, so these cannot be done here.
_UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
# Go's names (crypto/tls CipherSuites(), the list exporter-toolkit accepts) -> OpenSSL's. The TLS 1.3
# suites are accepted and, as in Go, not configurable: they only apply to TLS 1.2 and below.
_CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
}
# exporter-toolkit's http_server_config.headers: the only headers it lets a config set, and the
# values allowed where they are an enumeration (empty: any value).
_EXTRA_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (), "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"), "X-XSS-Protection": (), "Content-Security-Policy": (),
}
_UNSUPPORTED = {
    "tls_server_config": {
        "cert": "put the certificate in a file and name it in cert_file",
        "key": "put the key in a file and name it in key_file",
        "client_ca": "put the CA certificates in a file and name it in client_ca_file",
        "curve_preferences": "remove it (OpenSSL's default groups are used)",
    },
}
_BCRYPT_MAX_PASSWORD = 72  # bytes; bcrypt reads no further, and bcrypt >= 5 raises for longer ones
_HASH_ALPHABET = re.compile(r"[./A-Za-z0-9]{53}")
_HASH_ADVICE = "make one with `htpasswd -nBC 12 USER` and paste what follows `USER:`"
_DURATION = re.compile(r"(?:(?:\d+\.?\d*|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+")
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
                   "h": 3600.0}


class _Strict(Strict):
    model_config = ConfigDict(frozen=True)


def bcrypt_cost(hashed: str | bytes) -> int:
    """The cost of a bcrypt hash, checked by bcrypt itself (as exporter-toolkit checks with Go's
    bcrypt.Cost): ValueError, saying what is wrong, for anything that can never match a password."""
    text = hashed.decode("ascii", "replace") if isinstance(hashed, bytes) else hashed
    if not re.match(r"\$2[abxy]\$\d\d\$", text):
        raise ValueError("a bcrypt hash starts with $2a$, $2b$ or $2y$ and a two-digit cost, e.g. $2y$12$")
    if len(text) != 60:
        raise ValueError(f"a bcrypt hash is 60 characters, this one is {len(text)} (cut short, or with more "
                         "pasted after it?)")
    if not _HASH_ALPHABET.fullmatch(text[7:]):
        raise ValueError("after $2y$NN$ a bcrypt hash has only the characters ./A-Za-z0-9")
    cost = int(text[4:6])
    if not 4 <= cost <= 31:
        raise ValueError(f"bcrypt's cost is 04 to 31, this hash says {text[4:6]}")
    import bcrypt  # here and below: loaded only where a web config has users

    try:  # bcrypt parses the salt and checksum; at cost 4 so that loading stays quick whatever the cost
        bcrypt.checkpw(b"", (text[:4] + "04" + text[6:]).encode())
    except ValueError as exc:
        raise ValueError(f"bcrypt cannot read it ({exc})") from None
    return cost


def go_duration_seconds(text: str) -> float:
    """Seconds in a Go duration ("1s", "1m30s", "250ms"), the format exporter-toolkit reads."""
    if text == "0":
        return 0.0
    if not _DURATION.fullmatch(text):
        raise ValueError(f"{text!r} is not a duration; write a number and a unit (ns, us, ms, s, m, h), e.g. "
                         "1s, 100ms or 1m30s")
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in _DURATION_PART.findall(text))


class TLSServerConfig(_Strict):
    cert_file: Path
    key_file: Path
    client_auth_type: ClientAuthType = "NoClientCert"
    client_ca_file: Path | None = None
    client_allowed_sans: tuple[str, ...] | None = None
    min_version: TLSVersionName = "TLS12"
    max_version: TLSVersionName = "TLS13"
    cipher_suites: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True

    @field_validator("client_auth_type", mode="before")
    @classmethod
    def _verifiable(cls, value: Any) -> Any:
        if value in _UNVERIFIED_CLIENT_AUTH:
            raise ValueError(f"{value} takes client certificates without verifying them, which raypulse does not "
                             "do; use RequireAndVerifyClientCert (or VerifyClientCertIfGiven) with client_ca_file")
        return value

    @field_validator("cipher_suites")
    @classmethod
    def _known_ciphers(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [name for name in names if name not in _CIPHERS]
        if unknown:
            raise ValueError(f"unknown cipher suite(s) {', '.join(unknown)}; use Go's names, one of "
                             f"{', '.join(_CIPHERS)}")
        return names

    @model_validator(mode="after")
    def _workable(self) -> TLSServerConfig:
        if self.client_auth_type != "NoClientCert" and self.client_ca_file is None:
            raise ValueError(f"client_auth_type {self.client_auth_type} needs client_ca_file (the CA that signs "
                             "client certificates)")
        if self.client_auth_type == "NoClientCert" and self.client_ca_file is not None:
            raise ValueError("client_ca_file is set but client_auth_type is NoClientCert, so no client certificate "
                             "is ever asked for; set client_auth_type: RequireAndVerifyClientCert, or remove "
                             "client_ca_file")
        if self.client_allowed_sans is not None:
            if self.client_auth_type == "NoClientCert":
                raise ValueError("client_allowed_sans needs client certificates; set client_auth_type: "
                                 "RequireAndVerifyClientCert and client_ca_file")
            if not self.client_allowed_sans:
                raise ValueError("client_allowed_sans is empty, so every client would be refused; list the "
                                 "allowed names or remove it")
        order = list(_TLS_VERSIONS)
        if order.index(self.min_version) > order.index(self.max_version):
            raise ValueError(f"min_version {self.min_version} is above max_version {self.max_version}, so no TLS "
                             "version is left; lower min_version or raise max_version")
        return self


class HTTPServerConfig(_Strict):
    http2: bool = True  # accepted for exporter-toolkit's sake; aiohttp speaks HTTP/1.1 only
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _allowed_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if name not in _EXTRA_HEADERS:
                raise ValueError(f"HTTP header {name!r} can not be configured; the ones that can: "
                                 f"{', '.join(_EXTRA_HEADERS)}")
            allowed = _EXTRA_HEADERS[name]
            if allowed and value not in allowed:
                raise ValueError(f"{name}: {value!r} is not one of {', '.join(allowed)}")
        return headers


class RateLimit(_Strict):
    """exporter-toolkit's token bucket (golang.org/x/time/rate): one token every `interval`, at most
    `burst` of them saved up, one taken by every request; interval 0 turns it off."""

    interval: str = "0s"
    burst: int = Field(0, ge=0)

    @field_validator("interval", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
            return "0s"
        if not isinstance(value, str):
            raise ValueError(f"{value!r} has no unit; write a duration such as 1s or 100ms (exporter-toolkit would "
                             "read a bare number as nanoseconds)")
        go_duration_seconds(value)
        return value

    @property
    def seconds(self) -> float:
        return go_duration_seconds(self.interval)

    @model_validator(mode="after")
    def _workable(self) -> RateLimit:
        if self.seconds > 0 and self.burst < 1:
            raise ValueError(f"burst {self.burst} with interval {self.interval} answers every request 429; set "
                             "burst to at least 1 (the requests allowed at once), or interval to 0 for no limit")
        return self


class WebConfig(_Strict):
    tls_server_config: TLSServerConfig | None = None
    http_server_config: HTTPServerConfig = Field(default_factory=HTTPServerConfig)
    rate_limit: RateLimit = Field(default_factory=RateLimit)
    basic_auth_users: dict[str, str] = Field(default_factory=dict)
    auth_excluded_paths: tuple[str, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for section, keys in _UNSUPPORTED.items():
                scope = data.get(section)
                for key, fix in keys.items():
                    if isinstance(scope, dict) and key in scope:
                        raise ValueError(f"{section}.{key} is an exporter-toolkit setting raypulse does not support; "
                                         f"{fix}")
        return data

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt_hashes(cls, users: dict[str, str]) -> dict[str, str]:
        for user, hashed in users.items():
            if ":" in user:
                raise ValueError(f"user {user!r}: a basic auth user name cannot contain ':'; rename the user")
            try:
                bcrypt_cost(hashed)
            except ValueError as exc:
                raise ValueError(f"user {user!r}: the password must be a bcrypt hash, and this is not one: {exc}; "
                                 f"{_HASH_ADVICE.replace('USER', user)}") from None
        return users

    @field_validator("auth_excluded_paths")
    @classmethod
    def _paths(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        for path in paths:
            if not path.startswith("/") or "?" in path or "#" in path:
                raise ValueError(f"{path!r} is not a path; write it as the exporter serves it, e.g. /healthz")
        return paths


def config_warnings(config: WebConfig) -> list[str]:
    """What a config allows but should not: each is logged once when the config is loaded."""
    found = []
    if config == WebConfig():
        found.append("sets nothing (empty?): serving plain HTTP without authentication, as without --web-config")
    if config.basic_auth_users and config.tls_server_config is None:
        found.append("basic_auth_users without tls_server_config: passwords cross the network in clear text; "
                     "add tls_server_config")
    costs = sorted({bcrypt_cost(hashed) for hashed in config.basic_auth_users.values()})
    if len(costs) > 1:
        found.append(f"basic_auth_users have different bcrypt costs ({', '.join(map(str, costs))}): how long a login "
                     "takes tells which cost a user name has, hence that it exists; hash every password with "
                     "the same cost")
    if config.auth_excluded_paths and not config.basic_auth_users:
        found.append("auth_excluded_paths has no effect without basic_auth_users")
    if config.http_server_config.http2 and "http2" in config.http_server_config.model_fields_set:
        found.append("http_server_config.http2: true has no effect; the exporter serves HTTP/1.1")
    return found


_warned: set[str] = set()


def load_web_config(path: Path) -> WebConfig:
    """Read and validate; relative file paths are resolved against the config file's folder. What
    works but is unwise is logged as a WARNING, once per process."""
    data = read_yaml_file(path, "web config file")  # ConfigError for I/O, non-UTF-8 and YAML problems
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
    for message in config_warnings(config):
        said = f"web config file {path}: {message}"
        if said not in _warned:
            _warned.add(said)
            log.warning("%s", said)
    return config


def build_ssl_context(tls: TLSServerConfig) -> ssl.SSLContext:
    """A server SSLContext from the files as they are now; ConfigError naming the field if they do not load."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _TLS_VERSIONS[tls.min_version]
    context.maximum_version = _TLS_VERSIONS[tls.max_version]
    tls12 = [name for name in (_CIPHERS[suite] for suite in tls.cipher_suites) if name]
    if tls12:
        try:
            context.set_ciphers(":".join(tls12))
        except ssl.SSLError as exc:
            raise ConfigError(f"tls_server_config.cipher_suites: OpenSSL has none of them: {exc}") from None
    if not tls.prefer_server_cipher_suites:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    for name in ("cert_file", "key_file", *(("client_ca_file",) if tls.client_auth_type != "NoClientCert" else ())):
        path = getattr(tls, name)
        try:  # OpenSSL would wait on a FIFO (at a reload: on the event loop) and read /dev/zero for ever
            userinput.read_file(path)
        except userinput.InputError as exc:
            if not exc.missing:  # a missing file: OpenSSL's error below names the pair
                raise ConfigError(f"tls_server_config.{name} ({path}): {exc.problem}") from None
    asked: list[bool] = []

    def no_passphrase() -> bytes:  # never prompt on the terminal for an encrypted key
        asked.append(True)
        return b""

    try:
        context.load_cert_chain(tls.cert_file, tls.key_file, password=no_passphrase)
    except (OSError, ssl.SSLError) as exc:
        hint = "; the key is encrypted: give an unencrypted key" if asked else ""
        raise ConfigError(f"tls_server_config.cert_file/key_file ({tls.cert_file}, {tls.key_file}): "
                          f"cannot load the certificate and key: {exc}{hint}") from None
    if tls.client_auth_type != "NoClientCert":
        try:
            context.load_verify_locations(cafile=tls.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"tls_server_config.client_ca_file ({tls.client_ca_file}): cannot load: {exc}") from None
        context.verify_mode = _CLIENT_AUTH[tls.client_auth_type]
    return context


class ReloadingTLS:
    """The listener's SSLContext, following its files: at a new connection (its ClientHello, at most
    once a second) the certificate, key and client CA files are stat'ed, and when one changed
    (inode, size, mtime or ctime: a rename, a rewrite, a Kubernetes secret's symlink swap) a new
    context is built and the connection handed to it (`sni_callback` setting `SSLObject.context`,
    which swaps the certificate, key and CA store for that connection). Connections already open
    keep theirs. A replacement that does not load (half-written, key not matching) keeps the last
    good context and logs one WARNING per state of the files."""

    CHECK_INTERVAL_S = 1.0

    def __init__(self, tls: TLSServerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.tls = tls
        self._clock = clock
        self._signature = self._stat()
        self.context = build_ssl_context(tls)  # given to the listener; new connections start in it
        self.context.sni_callback = self._client_hello
        self._current = self.context
        self._checked_at = clock()
        self._failed: object = None
        self.reloads = 0

    @property
    def files(self) -> list[Path]:
        paths = [self.tls.cert_file, self.tls.key_file]
        if self.tls.client_auth_type != "NoClientCert" and self.tls.client_ca_file is not None:
            paths.append(self.tls.client_ca_file)
        return paths

    def _stat(self) -> tuple[tuple[int, ...], ...] | str:
        """What identifies the files' contents cheaply; an error's text when one cannot be stat'ed."""
        try:
            stats = [os.stat(path) for path in self.files]
        except OSError as exc:
            return f"{exc.filename}: {exc.strerror}"
        return tuple((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns) for s in stats)

    def check(self) -> bool:
        """Reload if the files changed since the last load; True when a new context was loaded."""
        signature = self._stat()
        if signature == self._signature or signature == self._failed:
            return False
        try:
            if isinstance(signature, str):
                raise ConfigError(signature)
            context = build_ssl_context(self.tls)
        except ConfigError as exc:
            self._failed = signature
            log.warning("TLS files changed but cannot be loaded, still serving the previous certificate: %s", exc)
            return False
        self._current, self._signature, self._failed = context, signature, None
        self.reloads += 1
        log.info("reloaded the TLS certificate and key from %s", ", ".join(map(str, self.files)))
        return True

    def _client_hello(self, connection: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
        # Runs inside the handshake on the event loop: cheap, and never raises (that would fail it).
        now = self._clock()
        if now - self._checked_at >= self.CHECK_INTERVAL_S:
            self._checked_at = now
            self.check()
        if self._current is not context:
            connection.context = self._current


def ssl_context(tls: TLSServerConfig) -> ssl.SSLContext:
    """The SSLContext for the listener; it re-reads the certificate, key and client CA when they change."""
    return ReloadingTLS(tls).context


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _checkpw(password: bytes, hashed: bytes) -> bool:
    import bcrypt

    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # bcrypt refuses the input; it matches nothing
        return False


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes.

    - An unknown user pays one bcrypt check of a dummy hash at the highest configured cost, so how
      long a refusal takes does not tell whether the user exists (exporter-toolkit's dummy is always
      cost 10, which leaks users with a higher cost).
    - Successful checks are remembered (bcrypt is meant to be slow, and Prometheus sends the same
      credentials every scrape) in an LRU of `CACHE_SIZE`, keyed by an HMAC of user and password under
      a key made at start, so no password is kept. Refusals are not remembered, unlike exporter-toolkit's
      cache (which keeps both, evicting at random): a flood of wrong passwords cannot push the real
      scraper's entry out; each refusal costs a full check, bounded by the slots below.
    - At most `slots` checks run at once (exporter-toolkit: one), each in a thread, so a flood of bad
      passwords waits its turn instead of taking every thread of the default executor.
    - A password over 72 bytes is refused at once: bcrypt reads no further (Go's compares only the
      first 72), and bcrypt >= 5 raises for it.
    """

    CACHE_SIZE = 1024

    def __init__(self, users: Mapping[str, str], excluded_paths: Iterable[str] = (),
                 slots: int | None = None) -> None:
        self._users = {user.encode(): hashed.encode() for user, hashed in users.items()}
        self.excluded_paths = frozenset(excluded_paths)
        self._allowed: OrderedDict[bytes, None] = OrderedDict()
        self._cache_key = os.urandom(32)
        self.dummy_cost = max((bcrypt_cost(hashed) for hashed in users.values()), default=10)
        # A hash no password matches, at that cost, made without paying the cost: a fresh salt and the
        # checksum of another hash (hashing at cost 20 would take a minute of start-up).
        import bcrypt

        checksum = bcrypt.hashpw(os.urandom(18).hex().encode(), bcrypt.gensalt(rounds=4))[29:]
        self.dummy_hash = bcrypt.gensalt(rounds=self.dummy_cost) + checksum
        self.slots = slots or _cpu_count()
        self._slots = asyncio.Semaphore(self.slots)

    async def allows(self, header: str | None) -> bool:
        credentials = parse_basic(header)
        if credentials is None:
            return False
        user, password = credentials
        if len(password) > _BCRYPT_MAX_PASSWORD:
            return False
        key = hmac.new(self._cache_key, len(user).to_bytes(4, "big") + user + password, hashlib.sha256).digest()
        if key in self._allowed:
            self._allowed.move_to_end(key)
            return True
        hashed = self._users.get(user)
        async with self._slots:
            matches = await asyncio.to_thread(_checkpw, password, hashed if hashed is not None else self.dummy_hash)
        if not matches or hashed is None:
            return False
        self._allowed[key] = None
        if len(self._allowed) > self.CACHE_SIZE:
            self._allowed.popitem(last=False)
        return True

    def excludes(self, request: web.Request) -> bool:
        """Whether the request goes to a route listed in auth_excluded_paths (matched on the route the
        router chose, so no spelling of another path gets past)."""
        if not self.excluded_paths:
            return False
        resource = request.match_info.route.resource
        return resource is not None and resource.canonical in self.excluded_paths

    def middleware(self) -> Middleware:
        @web.middleware
        async def require_basic_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
            if not self.excludes(request) and not await self.allows(request.headers.get("Authorization")):
                return web.Response(status=401, text="Unauthorized\n",
                                    headers={"WWW-Authenticate": 'Basic realm="raypulse exporter"'})
            return await handler(request)

        return require_basic_auth


def parse_basic(header: str | None) -> tuple[bytes, bytes] | None:
    """(user, password) from `Authorization: Basic ...`, as bytes; None for anything else."""
    if not header or header[:6].lower() != "basic ":
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True)
    except ValueError:  # binascii.Error, or characters outside ASCII
        return None
    user, sep, password = decoded.partition(b":")
    return (user, password) if sep else None


class RateLimiter:
    """A token bucket: `burst` tokens, one more every `interval` seconds, one per request."""

    def __init__(self, interval: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval, self.burst, self._clock = interval, burst, clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> float:
        """0 when the request may go; else the seconds until a token comes."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) / self.interval)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) * self.interval

    def middleware(self) -> Middleware:
        @web.middleware
        async def rate_limit(request: web.Request, handler: Handler) -> web.StreamResponse:
            wait = self.take()
            if wait:
                return web.Response(status=429, text="Too Many Requests\n",
                                    headers={"Retry-After": str(max(1, math.ceil(wait)))})
            return await handler(request)

        return rate_limit


def _extra_headers(headers: Mapping[str, str]) -> Middleware:
    @web.middleware
    async def add_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            exc.headers.update(headers)
            raise
        if not response.prepared:
            response.headers.update(headers)
        return response

    return add_headers


def _name_forms(value: str) -> set[str]:
    """A SAN as written, and an IP address also in its canonical form (Go's net.IP String())."""
    value = value.strip()
    try:
        return {value, str(ipaddress.ip_address(value))}
    except ValueError:
        return {value}


def _client_sans(allowed: Iterable[str]) -> Middleware:
    wanted = set().union(*(_name_forms(name) for name in allowed))

    @web.middleware
    async def check_client_sans(request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        peercert = transport.get_extra_info("peercert") if transport is not None else None
        sans = (peercert or {}).get("subjectAltName", ())
        if not any(_name_forms(value) & wanted for _, value in sans):
            return web.Response(status=403, text="Forbidden: the client certificate has none of the allowed "
                                                 "subject alternative names\n")
        return await handler(request)

    return check_client_sans


def middlewares(config: WebConfig) -> list[Middleware]:
    """What goes in front of every handler of the exporter's web application, outermost first: the
    rate limit (every request, as in exporter-toolkit), the configured response headers, the client
    certificate's SANs, basic auth (except on auth_excluded_paths)."""
    found: list[Middleware] = []
    if config.rate_limit.seconds > 0:
        found.append(RateLimiter(config.rate_limit.seconds, config.rate_limit.burst).middleware())
    if config.http_server_config.headers:
        found.append(_extra_headers(config.http_server_config.headers))
    tls = config.tls_server_config
    if tls is not None and tls.client_allowed_sans:
        found.append(_client_sans(tls.client_allowed_sans))
    if config.basic_auth_users:
        found.append(BasicAuth(config.basic_auth_users, config.auth_excluded_paths).middleware())
    return found
