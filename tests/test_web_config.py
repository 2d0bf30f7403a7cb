"""TLS and basic auth on a real exporter process, and malformed web config files."""

from __future__ import annotations

import base64
import ssl
import subprocess
import urllib.error
import urllib.request

import bcrypt
import pytest
import trustme

from tests.conftest import REPO, exporter_command, free_port, http_get

PASSWORD = "s3cret-scrape"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def write_tls_files(ca: trustme.CA, directory) -> None:
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(str(directory / "server.crt"))
    server.private_key_pem.write_to_path(str(directory / "server.key"))
    ca.cert_pem.write_to_path(str(directory / "ca.crt"))


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


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

    from tests.conftest import wait_until

    wait_until(ready, 30, "the TLS exporter to become ready")
    return exporter, client


def test_right_credentials_over_tls_get_metrics(tls_auth_exporter):
    exporter, client = tls_auth_exporter
    status, _, body = http_get(exporter.url + "/metrics", basic("prometheus", PASSWORD), context=client)
    assert status == 200
    assert b"raypulse_node_cpu_seconds_total" in body


@pytest.mark.parametrize("headers", [{}, basic("prometheus", "wrong"), basic("nobody", PASSWORD),
                                     {"Authorization": "Basic !!not-base64"}, {"Authorization": "Bearer x"}])
def test_missing_or_wrong_credentials_get_401(tls_auth_exporter, headers):
    exporter, client = tls_auth_exporter
    for path in ("/metrics", "/healthz", "/"):
        status, response_headers, _ = http_get(exporter.url + path, headers, context=client)
        assert status == 401
        assert response_headers["WWW-Authenticate"].startswith("Basic ")


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
    from tests.conftest import wait_until

    wait_until(lambda: http_get(exporter.url + "/healthz", context=with_cert)[0] == 200, 30, "mTLS exporter")
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        urllib.request.urlopen(exporter.url + "/healthz", timeout=5, context=without_cert).read()


MALFORMED = {
    "plain password": ("basic_auth_users:\n  alice: hunter2\n", "basic_auth_users: user 'alice': the password "
                       "must be a bcrypt hash"),
    "missing key file": ("tls_server_config:\n  cert_file: server.crt\n", "tls_server_config.key_file: "
                         "required"),
    "unknown client auth": ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: Sometimes\n",
                            "tls_server_config.client_auth_type"),
    "mtls without ca": ("tls_server_config:\n  cert_file: a\n  key_file: b\n"
                        "  client_auth_type: RequireAndVerifyClientCert\n", "needs client_ca_file"),
    "unsupported toolkit setting": ("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [x]\n",
                                    "tls_server_config.cipher_suites is an exporter-toolkit setting"),
    "typo": ("basic_auth_user:\n  alice: x\n", "basic_auth_user: unknown setting"),
    "unreadable certificate": ("tls_server_config:\n  cert_file: nothere.crt\n  key_file: nothere.key\n",
                               "tls_server_config.cert_file/key_file"),
    "not yaml": ("tls_server_config: [unclosed\n", "not valid YAML"),
    "not a mapping": ("- a\n- b\n", "the top level must be a mapping"),
}


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
