"""Secrets out of what the launcher shows, logs and keeps: one place that decides what looks like a
credential, used by the audit log, the run record (run.json), the display and `launcher status`.

What is hidden (the value becomes `<redacted>`, the name stays, so a reader still sees what was set):
- every environment variable value: the job's runtime env, and `NAME=value` prefixes of a command
  (`HF_TOKEN=x python train.py`, `export NAME=value`, `env NAME=value ...`);
- the value of a flag or `key=value` whose name says credential (`--password x`, `--api-key=x`,
  `token=x` in a query string, `WANDB_API_KEY=x` anywhere);
- the password in a URL (`https://user:<redacted>@host`), and the user of an http(s) URL without one
  (`https://<redacted>@github.com`, where tokens travel).

It errs on hiding: a flag named like a secret loses its value even when that is a file name.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "<redacted>"

# A name is sensitive when one of its words is one of these (words split at _ - . and camelCase).
_WORDS = frozenset({
    "password", "passwd", "pass", "passphrase", "pw", "secret", "secrets", "token", "tokens", "apikey",
    "credential", "credentials", "creds", "auth", "authorization", "cookie", "signature", "sig", "privatekey",
})
_WHERE = frozenset({"path", "file", "dir", "mode", "type", "length", "len", "id", "ids"})
_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"), ("client", "secret"),
                    ("session", "key"), ("account", "key"), ("sas", "key")})

_QUOTED = r"""(?:"(?:[^"\\]|\\.)*"|'[^']*')"""
_VALUE = rf"""(?:{_QUOTED}|[^\s;&|'"()<>`])(?:{_QUOTED}|[^\s;&|'"()`])*"""
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:'\"]*):(?P<secret>[^\s/@'\"]+)@")
_URL_USER = re.compile(r"(?P<head>\bhttps?://)(?P<secret>[^\s/@:'\"]+)@", re.IGNORECASE)
_FLAG = re.compile(rf"(?P<head>(?<![\w-])--?(?P<name>[A-Za-z][\w.-]*)(?:=|\s+))(?P<secret>{_VALUE})")
_ASSIGNMENT = re.compile(rf"(?P<head>(?<![\w.-])(?P<name>[A-Za-z_][\w.-]*)=)(?P<secret>{_VALUE})")
# A command line as shell words and operators, each keeping its original text.
_SHELL_TOKEN = re.compile(rf"""\s+|&&|\|\||[;&|(){{}}\n`]|(?:{_QUOTED}|\\.|[^\s;&|(){{}}`'"\\])+|.""")
_ENV_NAME = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=")
_PREFIX_WORDS = frozenset({"export", "env", "sudo", "nohup", "exec", "time", "command", "then", "do", "else"})


def sensitive(name: str) -> bool:
    """Whether a flag, variable or key name says it holds a credential (`HF_TOKEN`, `--api-key`, `apiKey`)."""
    words = [word.lower() for word in re.split(r"[_\-.\s]+|(?<=[a-z0-9])(?=[A-Z])", name.strip("-")) if word]
    if words and words[-1] in _WHERE:
        return False  # `token_path`, `--password-file`: where a secret is, not the secret
    return any(word in _WORDS for word in words) or any(pair in _PAIRS for pair in itertools.pairwise(words))


def _hide_when_sensitive(match: re.Match[str]) -> str:
    name = match.group("name")
    if not sensitive(name) or name.lower().startswith("no-"):
        return match.group(0)
    value = match.group("secret")
    if match.group("head").endswith((" ", "\t", "\n")) and value.startswith("-"):
        return match.group(0)  # `--token --verbose`: a flag without a value, then the next flag
    return match.group("head") + REDACTED


def text(value: str) -> str:
    """A free-form line (a message, an error, a URL) with credential-looking values hidden."""
    value = _URL_PASSWORD.sub(lambda m: f"{m.group('head')}:{REDACTED}@", value)
    value = _URL_USER.sub(lambda m: f"{m.group('head')}{REDACTED}@", value)
    value = _FLAG.sub(_hide_when_sensitive, value)
    return _ASSIGNMENT.sub(_hide_when_sensitive, value)


def command(line: str) -> str:
    """A shell command line (an entrypoint) with every `NAME=value` environment prefix's value hidden,
    as well as what text() hides."""
    out, at_start = [], True
    for token in _SHELL_TOKEN.findall(line):
        if token.isspace() and token != "\n":
            out.append(token)
            continue
        if token in ("&&", "||", "\n") or token in ";&|(){}`":
            at_start = True
        elif at_start and (match := _ENV_NAME.match(token)):
            token = f"{match.group('name')}={REDACTED}"
        elif token not in _PREFIX_WORDS:
            at_start = False
        out.append(token)
    return text("".join(out))


def env(variables: Mapping[str, Any]) -> dict[str, str]:
    """Environment variables with their names kept and every value hidden."""
    return dict.fromkeys(variables, REDACTED)


def spec(data: Mapping[str, Any]) -> dict[str, Any]:
    """A job spec as a mapping (JobSpec.model_dump), fit to keep or show: runtime env values hidden,
    the entrypoint through command(), the other strings through text()."""
    result = details(data)
    if isinstance(data.get("entrypoint"), str):
        result["entrypoint"] = command(data["entrypoint"])
    runtime = data.get("runtime_env")
    if isinstance(runtime, Mapping) and isinstance(runtime.get("env_vars"), Mapping):
        result["runtime_env"] = {**result["runtime_env"], "env_vars": env(runtime["env_vars"])}
    return result


def details(value: Any, key: str | None = None) -> Any:
    """Any JSON-like value (an audit line's details, an event's), recursively: a sensitive key's value
    hidden whole, `entrypoint`/`command` strings as commands, environment mappings' values hidden,
    other strings through text()."""
    if key is not None and sensitive(key) and value not in (None, "", [], {}):
        return REDACTED
    if isinstance(value, Mapping):
        if key in ("env", "env_vars", "environment"):
            return env(value)
        return {name: details(item, str(name)) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [details(item, key) for item in value]
    if isinstance(value, str):
        return command(value) if key in ("entrypoint", "command") else text(value)
    return value
