"""TLS, basic auth, rate limit and certificate rotation on a real exporter process, and malformed web
config files."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import socket
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import bcrypt
import pytest
import trustme
from cryptography import x509

from exporter.config import ConfigError
from exporter.serving import webconfig
from exporter.serving.webconfig import BasicAuth, bcrypt_cost, build_ssl_context, config_warnings, load_web_config
from tests.conftest import REPO, exporter_command, free_port, http_get, wait_until

PASSWORD = "s3cret-scrape"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def write_tls_files(ca: trustme.CA, directory) -> int:
    """The server's certificate and key (replaced atomically, as a rotation does) and the CA that
    signs it; the certificate's serial number."""
    server = ca.issue_cert("127.0.0.1", "localhost")
    replace(directory / "server.crt", server.cert_chain_pems[0].bytes())
    replace(directory / "server.key", server.private_key_pem.bytes())
    ca.cert_pem.write_to_path(str(directory / "ca.crt"))
    return x509.load_pem_x509_certificate(server.cert_chain_pems[0].bytes()).serial_number


def replace(path: Path, content: bytes) -> None:
    staged = path.with_name(path.name + ".new")
    staged.write_bytes(content)
    os.replace(staged, path)


def served_serial(url: str, context: ssl.SSLContext) -> int:
    """The serial number of the certificate a new connection to the server is given."""
    host, port = urlsplit(url).hostname, urlsplit(url).port
    with socket.create_connection((host, port), timeout=5) as sock, \
            context.wrap_socket(sock, server_hostname=host) as connection:
        return x509.load_der_x509_certificate(connection.getpeercert(binary_form=True)).serial_number


def bcrypt_hash(password: str, cost: int = 4) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=cost)).decode().replace("$2b$", "$2y$", 1)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def authorization(user: str, password: str) -> str:
    return basic(user, password)["Authorization"]


def listening(exporter) -> bool:
    """Whether the server is up, without sending it a request (that would take a rate limit token)."""
    return f"listening on {exporter.url} " in exporter.log.read_text()


@pytest.fixture
def tls_auth_exporter(ca, tmp_path, start_exporter):
    write_tls_files(ca, tmp_path)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode().replace("$2b$", "$2y$", 1)
    (tmp_path / "web.yml").write_text(f"""
tls_server_config:
  cert_file: server.crt   # relative to this file
  key_file: server.key
basic_auth_users:
  prometheus: '{hashed}'
""")
    exporter = start_exporter("--web-config", str(tmp_path / "web.yml"), ready=False, scheme="https")
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))

    def ready() -> bool:
        return http_get(exporter.url + "/readyz", basic("prometheus", PASSWORD), context=client)[0] == 200

    wait_until(ready, 30, "the TLS exporter to become ready")
    return exporter, client


def test_right_credentials_over_tls_get_metrics(tls_auth_exporter):
    exporter, client = tls_auth_exporter
    status, _, body = http_get(exporter.url + "/metrics", basic("prometheus", PASSWORD), context=client)
    assert status == 200
    assert b"raypulse_node_cpu_seconds_total" in body


@pytest.mark.parametrize("headers", [{}, basic("prometheus", "wrong"), basic("nobody", PASSWORD),
                                     {"Authorization": "Basic !!not-base64"}, {"Authorization": "Bearer x"},
                                     {"Authorization": "Basic \xe9t\xe9"}, basic("prometheus", "\x00" * 8)])
def test_missing_or_wrong_credentials_get_401(tls_auth_exporter, headers):
    exporter, client = tls_auth_exporter
    for path in ("/metrics", "/healthz", "/"):
        status, response_headers, _ = http_get(exporter.url + path, headers, context=client)
        assert status == 401
        assert response_headers["WWW-Authenticate"].startswith("Basic ")


@pytest.mark.parametrize("user", ["prometheus", "nobody"])
def test_a_password_over_72_bytes_gets_401_not_500(tls_auth_exporter, user):
    exporter, client = tls_auth_exporter
    for password in ("x" * 73, PASSWORD + "x" * 100, "é" * 37):
        status, _, _ = http_get(exporter.url + "/metrics", basic(user, password), context=client)
        assert status == 401
    assert "Traceback" not in exporter.log.read_text()


def test_plain_http_is_refused_when_tls_is_configured(tls_auth_exporter):
    exporter, _ = tls_auth_exporter
    plain_url = exporter.url.replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(plain_url + "/metrics", timeout=5).read()


def test_a_client_that_does_not_trust_the_certificate_is_refused(tls_auth_exporter):
    exporter, _ = tls_auth_exporter
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(exporter.url + "/healthz", timeout=5, context=ssl.create_default_context())


def test_mutual_tls_requires_a_client_certificate_from_the_ca(ca, tmp_path, start_exporter):
    write_tls_files(ca, tmp_path)
    (tmp_path / "web.yml").write_text(f"""
tls_server_config:
  cert_file: {tmp_path / 'server.crt'}
  key_file: {tmp_path / 'server.key'}
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {tmp_path / 'ca.crt'}
""")
    exporter = start_exporter("--web-config", str(tmp_path / "web.yml"), ready=False, scheme="https")
    with_cert = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    ca.issue_cert("prometheus@example").configure_cert(with_cert)
    without_cert = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))

    wait_until(lambda: http_get(exporter.url + "/healthz", context=with_cert)[0] == 200, 30, "mTLS exporter")
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        urllib.request.urlopen(exporter.url + "/healthz", timeout=5, context=without_cert).read()


def test_client_allowed_sans_admit_only_certificates_naming_one_of_them(ca, tmp_path, start_exporter):
    write_tls_files(ca, tmp_path)
    (tmp_path / "web.yml").write_text("""
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
  client_allowed_sans: [prometheus@example, 10.0.0.1]
""")
    exporter = start_exporter("--web-config", str(tmp_path / "web.yml"), ready=False, scheme="https")

    def client(identity: str) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        ca.issue_cert(identity).configure_cert(context)
        return context

    wait_until(lambda: http_get(exporter.url + "/healthz", context=client("prometheus@example"))[0] == 200, 30,
               "the mTLS exporter")
    assert http_get(exporter.url + "/metrics", context=client("10.0.0.1"))[0] == 200
    status, _, body = http_get(exporter.url + "/metrics", context=client("intruder@example"))
    assert status == 403
    assert b"subject alternative names" in body


@pytest.fixture
def health_open_exporter(ca, tmp_path, start_exporter):
    """TLS and basic auth, /healthz and /readyz excluded from it, and two extra response headers."""
    write_tls_files(ca, tmp_path)
    (tmp_path / "web.yml").write_text(f"""
tls_server_config:
  cert_file: server.crt
  key_file: server.key
basic_auth_users:
  prometheus: '{bcrypt_hash(PASSWORD)}'
auth_excluded_paths: [/healthz, /readyz]
http_server_config:
  headers:
    X-Frame-Options: deny
    X-Content-Type-Options: nosniff
""")
    exporter = start_exporter("--web-config", str(tmp_path / "web.yml"), ready=False, scheme="https")
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    wait_until(lambda: http_get(exporter.url + "/healthz", context=client)[0] == 200, 30, "the exporter")
    return exporter, client


def test_auth_excluded_paths_are_served_without_credentials_and_nothing_else_is(health_open_exporter):
    exporter, client = health_open_exporter
    assert http_get(exporter.url + "/healthz", context=client)[0] == 200
    assert http_get(exporter.url + "/healthz?verbose=1", context=client)[0] == 200
    assert http_get(exporter.url + "/readyz", context=client)[0] in (200, 503)  # not 401
    for path in ("/metrics", "/", "/healthz/", "/HEALTHZ", "//healthz", "/healthz/../metrics", "/%68ealthz/x"):
        assert http_get(exporter.url + path, context=client)[0] == 401, path
    status, _, body = http_get(exporter.url + "/metrics", basic("prometheus", PASSWORD), context=client)
    assert status == 200
    assert b"raypulse_exporter_build_info" in body


def test_configured_response_headers_are_on_every_answer(health_open_exporter):
    exporter, client = health_open_exporter
    for path, headers in (("/healthz", {}), ("/metrics", {}), ("/metrics", basic("prometheus", PASSWORD))):
        _, response_headers, _ = http_get(exporter.url + path, headers, context=client)
        assert response_headers["X-Frame-Options"] == "deny"
        assert response_headers["X-Content-Type-Options"] == "nosniff"


def test_requests_over_the_rate_limit_get_429_with_retry_after(tmp_path, start_exporter):
    # One token an hour: none comes back while the test runs, so exactly `burst` requests pass.
    (tmp_path / "web.yml").write_text("rate_limit:\n  interval: 1h\n  burst: 3\n")
    exporter = start_exporter("--web-config", str(tmp_path / "web.yml"), ready=False)
    wait_until(lambda: listening(exporter), 30, "the exporter to listen")
    assert [exporter.get("/healthz")[0] for _ in range(3)] == [200, 200, 200]
    for path in ("/healthz", "/metrics"):
        status, headers, _ = exporter.get(path)
        assert status == 429
        assert 1 <= int(headers["Retry-After"]) <= 3600


def test_a_rotated_certificate_is_served_without_a_restart_and_a_broken_one_is_not(ca, tmp_path, start_exporter):
    first = write_tls_files(ca, tmp_path)
    (tmp_path / "web.yml").write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    exporter = start_exporter("--web-config", str(tmp_path / "web.yml"), ready=False, scheme="https")
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    wait_until(lambda: served_serial(exporter.url, client) == first, 30, "the exporter to serve the first certificate")

    replace(tmp_path / "server.crt", b"-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n")
    wait_until(lambda: served_serial(exporter.url, client) == first
               and "cannot be loaded, still serving the previous certificate" in exporter.log.read_text(), 30,
               "the exporter to try the broken certificate")
    assert served_serial(exporter.url, client) == first
    assert exporter.get("/healthz", context=client)[0] == 200

    second = write_tls_files(ca, tmp_path)
    wait_until(lambda: served_serial(exporter.url, client) == second, 30, "the exporter to serve the new certificate")
    assert exporter.get("/healthz", context=client)[0] == 200
    assert exporter.process.poll() is None


def test_a_rotated_client_ca_decides_which_client_certificates_are_accepted(ca, tmp_path, start_exporter):
    write_tls_files(ca, tmp_path)
    old_ca, new_ca = trustme.CA(), trustme.CA()
    replace(tmp_path / "clients.crt", old_ca.cert_pem.bytes())
    (tmp_path / "web.yml").write_text("""
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: clients.crt
""")
    exporter = start_exporter("--web-config", str(tmp_path / "web.yml"), ready=False, scheme="https")

    def client(issuer: trustme.CA) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        issuer.issue_cert("prometheus@example").configure_cert(context)
        return context

    old_client, new_client = client(old_ca), client(new_ca)
    wait_until(lambda: http_get(exporter.url + "/healthz", context=old_client)[0] == 200, 30, "the mTLS exporter")
    replace(tmp_path / "clients.crt", new_ca.cert_pem.bytes())
    wait_until(lambda: http_get(exporter.url + "/healthz", context=new_client)[0] == 200, 30,
               "the exporter to accept clients of the new CA")
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        http_get(exporter.url + "/healthz", context=old_client)


async def test_an_unknown_user_costs_a_bcrypt_check_at_the_highest_configured_cost(monkeypatch):
    auth = BasicAuth({"fast": bcrypt_hash("a", cost=4), "slow": bcrypt_hash("b", cost=12)})
    assert bcrypt_cost(auth.dummy_hash) == 12
    checked = []
    check = webconfig._checkpw

    def spy(password: bytes, hashed: bytes) -> bool:
        checked.append(hashed)
        return check(password, hashed)

    monkeypatch.setattr(webconfig, "_checkpw", spy)
    assert not await auth.allows(authorization("nobody", "b"))
    assert checked == [auth.dummy_hash]  # one full check, of a hash that costs what the slowest user costs


async def test_the_verdict_cache_keeps_recently_used_logins_past_1024_others(monkeypatch):
    hashed = bcrypt_hash("right")
    auth = BasicAuth({f"user{i}": hashed for i in range(BasicAuth.CACHE_SIZE + 100)})
    checked: list[bytes] = []

    def counting(password: bytes, hashed: bytes) -> bool:
        checked.append(password)
        return password == b"right"

    monkeypatch.setattr(webconfig, "_checkpw", counting)
    assert await auth.allows(authorization("user0", "right"))
    for i in range(1, BasicAuth.CACHE_SIZE + 100):
        assert await auth.allows(authorization(f"user{i}", "right"))
        if i % 100 == 0:
            assert await auth.allows(authorization("user0", "right"))  # in use: stays
    for i in range(2 * BasicAuth.CACHE_SIZE):  # a flood of wrong passwords pushes nothing out
        assert not await auth.allows(authorization("user0", f"guess{i}"))
    assert len(checked) == BasicAuth.CACHE_SIZE + 100 + 2 * BasicAuth.CACHE_SIZE  # once per login, never again

    assert await auth.allows(authorization("user0", "right"))
    assert len(checked) == 3 * BasicAuth.CACHE_SIZE + 100  # still remembered
    assert await auth.allows(authorization("user1", "right"))
    assert len(checked) == 3 * BasicAuth.CACHE_SIZE + 101  # the least recently used was let go


async def test_at_most_one_bcrypt_check_per_slot_runs_at_once(monkeypatch):
    assert BasicAuth({}).slots == len(os.sched_getaffinity(0))
    auth = BasicAuth({"prometheus": bcrypt_hash("right")}, slots=2)
    lock, release = threading.Lock(), threading.Event()
    running, most = 0, 0

    def held(password: bytes, hashed: bytes) -> bool:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(30)
        with lock:
            running -= 1
        return False

    monkeypatch.setattr(webconfig, "_checkpw", held)
    logins = [asyncio.create_task(auth.allows(authorization("prometheus", f"guess{i}"))) for i in range(8)]
    for _ in range(3000):
        if running == 2:
            break
        await asyncio.sleep(0.01)
    assert running == 2
    release.set()
    assert await asyncio.gather(*logins) == [False] * 8
    assert most == 2


def test_cipher_suites_and_versions_reach_the_ssl_context(ca, tmp_path):
    write_tls_files(ca, tmp_path)
    (tmp_path / "web.yml").write_text("""
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  min_version: TLS12
  max_version: TLS12
  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
                  TLS_AES_128_GCM_SHA256]
  prefer_server_cipher_suites: false
""")
    context = build_ssl_context(load_web_config(tmp_path / "web.yml").tls_server_config)
    assert context.maximum_version == ssl.TLSVersion.TLSv1_2
    assert {c["name"] for c in context.get_ciphers() if c["protocol"] == "TLSv1.2"} == {
        "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-CHACHA20-POLY1305"}
    assert not context.options & ssl.OP_CIPHER_SERVER_PREFERENCE


def test_basic_auth_over_plain_http_is_warned_about_once(tmp_path, caplog):
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  prometheus: '{bcrypt_hash(PASSWORD)}'\n")
    with caplog.at_level(logging.WARNING, logger="exporter.serving.webconfig"):
        config = load_web_config(path)
        load_web_config(path)
    said = [record.getMessage() for record in caplog.records if "clear text" in record.getMessage()]
    assert len(said) == 1
    assert str(path) in said[0]
    assert any("clear text" in message for message in config_warnings(config))


def test_users_hashed_with_different_costs_are_warned_about():
    config = webconfig.WebConfig(basic_auth_users={"a": bcrypt_hash("a", 4), "b": bcrypt_hash("b", 5)})
    assert any("different bcrypt costs (4, 5)" in message for message in config_warnings(config))


def test_an_empty_web_config_loads_as_defaults_with_a_warning(tmp_path):
    path = tmp_path / "web.yml"
    path.write_text("# nothing yet\n")
    result = subprocess.run(exporter_command("check-config", "--web-config", str(path)), capture_output=True,
                            text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert f"web config file {path}: sets nothing" in result.stderr


def test_a_web_config_that_is_not_utf8_exits_2_naming_the_file(tmp_path):
    path = tmp_path / "web.yml"
    path.write_bytes(b"basic_auth_users:\n  caf\xe9: x\n")
    result = subprocess.run(exporter_command("serve", "--listen", f"127.0.0.1:{free_port()}", "--web-config",
                                             str(path)), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2, result.stderr
    assert "not UTF-8" in result.stderr
    assert str(path) in result.stderr
    assert "Traceback" not in result.stderr
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_web_config(path)


A_HASH = "$2y$04$" + "N9qo8uLOickgx2ZMRZoMye" + "IjZAgcfl7p92ldGxad68LJZdL17lhWy"
MALFORMED = {
    "plain password": ("basic_auth_users:\n  alice: hunter2\n", "basic_auth_users: user 'alice': the password "
                       "must be a bcrypt hash"),
    "hash cut short": (f"basic_auth_users:\n  alice: '{A_HASH[:-1]}'\n", "user 'alice': the password must be a "
                       "bcrypt hash, and this is not one: a bcrypt hash is 60 characters, this one is 59"),
    "hash bcrypt cannot read": ("basic_auth_users:\n  alice: '$2y$04$" + "a" * 53 + "'\n",
                                "user 'alice': the password must be a bcrypt hash, and this is not one: bcrypt "
                                "cannot read it"),
    "hash cost out of range": (f"basic_auth_users:\n  alice: '{A_HASH.replace('$04$', '$03$')}'\n",
                               "bcrypt's cost is 04 to 31"),
    "user name with a colon": (f"basic_auth_users:\n  'a:b': '{A_HASH}'\n", "user 'a:b': a basic auth user name "
                               "cannot contain ':'"),
    "hash advice names the user": ("basic_auth_users:\n  alice: hunter2\n", "htpasswd -nBC 12 alice"),
    "missing key file": ("tls_server_config:\n  cert_file: server.crt\n", "tls_server_config.key_file: "
                         "required"),
    "unknown client auth": ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: Sometimes\n",
                            "tls_server_config.client_auth_type"),
    "unverified client auth": ("tls_server_config:\n  cert_file: a\n  key_file: b\n"
                               "  client_auth_type: RequireAnyClientCert\n", "without verifying them"),
    "mtls without ca": ("tls_server_config:\n  cert_file: a\n  key_file: b\n"
                        "  client_auth_type: RequireAndVerifyClientCert\n", "needs client_ca_file"),
    "ca without client auth": ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_ca_file: c\n",
                               "client_ca_file is set but client_auth_type is NoClientCert"),
    "allowed sans without client certificates": (
        "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_allowed_sans: [x]\n",
        "client_allowed_sans needs client certificates"),
    "min version above max": ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS13\n"
                              "  max_version: TLS12\n", "min_version TLS13 is above max_version TLS12"),
    "unknown cipher": ("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [RC4]\n",
                       "unknown cipher suite(s) RC4"),
    "unsupported toolkit setting": ("tls_server_config:\n  cert_file: a\n  key_file: b\n  curve_preferences: [x]\n",
                                    "tls_server_config.curve_preferences is an exporter-toolkit setting"),
    "inline certificate": ("tls_server_config:\n  cert: '-----BEGIN'\n  key_file: b\n",
                           "tls_server_config.cert is an exporter-toolkit setting raypulse does not support; put"),
    "header that cannot be set": ("http_server_config:\n  headers:\n    Content-Type: foo\n",
                                  "HTTP header 'Content-Type' can not be configured"),
    "header value not allowed": ("http_server_config:\n  headers:\n    X-Frame-Options: always\n",
                                 "X-Frame-Options: 'always' is not one of deny, sameorigin"),
    "rate limit without burst": ("rate_limit:\n  interval: 1s\n", "burst 0 with interval 1s answers every request "
                                 "429"),
    "rate limit interval without unit": ("rate_limit:\n  interval: 5\n  burst: 1\n", "5 has no unit"),
    "rate limit interval not a duration": ("rate_limit:\n  interval: 5 minutes\n  burst: 1\n", "is not a duration"),
    "rate limit typo": ("rate_limit:\n  interval: 1s\n  brust: 1\n", "rate_limit.brust: unknown setting"),
    "excluded path not a path": ("auth_excluded_paths: [healthz]\n", "'healthz' is not a path"),
    "typo": ("basic_auth_user:\n  alice: x\n", "basic_auth_user: unknown setting"),
    "unreadable certificate": ("tls_server_config:\n  cert_file: nothere.crt\n  key_file: nothere.key\n",
                               "tls_server_config.cert_file/key_file"),
    "not yaml": ("tls_server_config: [unclosed\n", "not valid YAML"),
    "not a mapping": ("- a\n- b\n", "the top level must be a mapping"),
}


def test_the_sample_hash_is_valid():
    assert bcrypt_cost(A_HASH) == 4


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_web_config_exits_non_zero_naming_the_field(name, tmp_path):
    content, expected = MALFORMED[name]
    path = tmp_path / "web.yml"
    path.write_text(content)
    result = subprocess.run(exporter_command("serve", "--listen", f"127.0.0.1:{free_port()}", "--web-config",
                                             str(path)), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert str(path) in result.stderr
