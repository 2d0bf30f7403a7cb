"""Secrets out of what the launcher shows, logs and keeps: one place that decides what looks like a
credential, used by the audit log, the run record (run.json), the display and `launcher status`.

What is hidden (the value becomes `<redacted>`, the name stays, so a reader still sees what was set):
- every environment variable value: the job's runtime env, and `NAME=value` prefixes of a command
  (`HF_TOKEN=x python train.py`, `export NAME=value`, `env NAME=value ...`), also inside the script
  of `bash -c '...'` (any shell's `-c`);
- the value of a flag or `key=value` whose name says credential (`--password x`, `--api-key=x`,
  `--wandb-key x`, `--bearer x`, `token=x` in a query string, `WANDB_API_KEY=x` anywhere), of a
  quoted key (`os.environ['HF_TOKEN']='x'`, `"api_key": "x"`), of `set NAME x` (`aws configure set
  aws_secret_access_key x`) and of a header (`-H "Authorization: Bearer x"`, `Bearer x` anywhere);
- the passwords of a few well-known clients given as a short option (`mysql -px`, `redis-cli -a x`,
  `sshpass -p x`);
- the password in a URL (`https://user:<redacted>@host`), and the user of an http(s) URL without one
  (`https://<redacted>@github.com`, where tokens travel).

It errs on hiding: a flag named like a secret loses its value even when that is a file name. It is
still best effort (a command line can spell a secret in endless ways): secrets belong in the job's
environment variables, whose values are always hidden.
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
    "bearer",
})
# `<something>-key` is a credential (`--wandb-key`, `--openai-key`) unless the word before says what
# kind of key that is not: a sort key, a primary key, a public key.
_NOT_SECRET_KEYS = frozenset({"sort", "primary", "foreign", "partition", "group", "cache", "dict", "map", "hash",
                              "shard", "public", "pub", "row", "column", "index", "label", "join", "lookup",
                              "handle", "routing", "idempotency", "unique", "composite", "seed", "by"})
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
# `-H "Authorization: Bearer x"`, `--header=X-Api-Key:x`: a header inside a quoted or -H/--header argument.
_HEADER = re.compile(r"""(?P<head>(?<=["'])(?P<name>[A-Za-z][\w-]*):[ \t]*)(?P<secret>[^"'\n]*[^"'\s])"""
                     r"""|(?P<head2>(?:(?<=-H )|(?<=--header[= ]))(?P<name2>[A-Za-z][\w-]*):)"""
                     r"""(?P<secret2>(?:\\.|[^\s"'])+)""")
_BEARER = re.compile(r"""(?P<head>(?<![\w-])Bearer(?:\\?[ \t])+)(?P<secret>[^\s"'<>\\]+)""")
# A quoted key given a value: `os.environ['HF_TOKEN'] = 'x'`, `{"api_key": "x"}`.
_QUOTED_KEY = re.compile(rf"""(?P<head>(?P<q>['"])(?P<name>[A-Za-z_][\w.-]*)(?P=q)\s*(?:\]\s*=|:)\s*)"""
                         rf"""(?P<secret>{_VALUE})""")
# `aws configure set aws_secret_access_key x`, `npm config set _authToken x`.
_SET = re.compile(rf"(?P<head>(?<![\w-])set\s+(?P<name>[A-Za-z_][\w.-]*)\s+)(?P<secret>{_VALUE})")
_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "ash"})
_SHELL_SCRIPT_FLAG = re.compile(r"-[A-Za-z]*c")  # `bash -c`, `sh -lc`, `bash -ec`
# Clients whose password is a short option: program -> (option, whether it is glued: `-px`).
_PASSWORD_OPTIONS = {"mysql": ("-p", True), "mysqldump": ("-p", True), "mysqladmin": ("-p", True),
                     "mariadb": ("-p", True), "mariadb-dump": ("-p", True), "redis-cli": ("-a", False),
                     "sshpass": ("-p", False)}


def sensitive(name: str) -> bool:
    """Whether a flag, variable or key name says it holds a credential (`HF_TOKEN`, `--api-key`, `apiKey`)."""
    words = [word.lower() for word in re.split(r"[_\-.\s]+|(?<=[a-z0-9])(?=[A-Z])", name.strip("-")) if word]
    if words and words[-1] in _WHERE:
        return False  # `token_path`, `--password-file`: where a secret is, not the secret
    if len(words) >= 2 and words[-1] in ("key", "keys") and words[-2] not in _NOT_SECRET_KEYS:
        return True
    return any(word in _WORDS for word in words) or any(pair in _PAIRS for pair in itertools.pairwise(words))


def _hide_when_sensitive(match: re.Match[str]) -> str:
    name = match.group("name")
    if not sensitive(name) or name.lower().startswith("no-"):
        return match.group(0)
    value = match.group("secret")
    if match.group("head").endswith((" ", "\t", "\n")) and value.startswith("-"):
        return match.group(0)  # `--token --verbose`: a flag without a value, then the next flag
    return match.group("head") + REDACTED


def _hide_header(match: re.Match[str]) -> str:
    if match.group("head") is not None:  # inside quotes: the value runs to the closing quote
        return _hide_when_sensitive(match)
    name, head = match.group("name2"), match.group("head2")  # one shell word: -H Name:value
    return head + REDACTED if sensitive(name) else match.group(0)


def text(value: str) -> str:
    """A free-form line (a message, an error, a URL) with credential-looking values hidden."""
    value = _URL_PASSWORD.sub(lambda m: f"{m.group('head')}:{REDACTED}@", value)
    value = _URL_USER.sub(lambda m: f"{m.group('head')}{REDACTED}@", value)
    value = _HEADER.sub(_hide_header, value)
    value = _BEARER.sub(lambda m: m.group("head") + REDACTED, value)
    value = _QUOTED_KEY.sub(_hide_when_sensitive, value)
    value = _SET.sub(_hide_when_sensitive, value)
    value = _FLAG.sub(_hide_when_sensitive, value)
    return _ASSIGNMENT.sub(_hide_when_sensitive, value)


def command(line: str) -> str:
    """A shell command line (an entrypoint) with every `NAME=value` environment prefix's value hidden,
    as well as what text() hides."""
    out: list[str] = []
    words: list[str] = []  # the current simple command's words so far (not its NAME=value prefixes)
    at_start = True
    for token in _SHELL_TOKEN.findall(line):
        if token.isspace() and token != "\n":
            out.append(token)
            continue
        if token in ("&&", "||", "\n") or token in ";&|(){}`":
            at_start, words = True, []
        elif at_start and (match := _ENV_NAME.match(token)):
            token = f"{match.group('name')}={REDACTED}"
        else:
            if token not in _PREFIX_WORDS:
                at_start = False
            shown = _argument(words, token)
            words.append(token)
            token = shown
        out.append(token)
    return text("".join(out))


def _argument(words: list[str], token: str) -> str:
    """One word of a command, hidden by what came before it: a shell's `-c` script (redacted as a
    command of its own), a known client's password option."""
    programs = {word.rsplit("/", 1)[-1] for word in words}
    previous = words[-1] if words else ""
    if (programs & _SHELLS and _SHELL_SCRIPT_FLAG.fullmatch(previous) and len(token) >= 2
            and token[0] in "'\"" and token[-1] == token[0]):
        return token[0] + command(token[1:-1]) + token[-1]
    for program in programs & _PASSWORD_OPTIONS.keys():
        option, glued = _PASSWORD_OPTIONS[program]
        if glued and token.startswith(option) and len(token) > len(option):
            return option + REDACTED
        if not glued and previous == option and not token.startswith("-"):
            return REDACTED
    return token


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
