"""The one safe way to read what a user hands us: files (configs, job specs, pod templates, runtime
envs, web configs, @FILE flags) and YAML or JSON text (files, flags, environment variables).

A file is read only if it is a regular file (opened non-blocking, then fstat: a FIFO never blocks,
/dev/zero is refused) and no larger than a cap, read with a bounded read. YAML aliases may not expand
a document past that same cap (a "billion laughs" chain is refused while it is still a small graph of
nodes) nor refer to themselves; nesting is bounded for YAML and JSON alike, so no RecursionError
escapes. Every problem is an InputError whose message says what is wrong and what to do, without
naming the input: the caller names it (a flag, a file, an environment variable). The launcher
imports this module too; it imports only the standard library (PyYAML when YAML is read).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 1 << 20  # 1 MiB: a Kubernetes object must fit etcd's 1.5 MiB; no config of ours comes near
MAX_DEPTH = 64  # levels of nesting; a pod template's deepest field (affinity terms) is about 15 levels down
MAX_EXPANDED = MAX_FILE_BYTES  # a YAML document with its aliases expanded (scalars counted by length)


class InputError(ValueError):
    """A user's input that cannot be used. `problem` says why (and the fix) without naming the input;
    `unreadable` is the system's reason when a file could not be read, `missing` whether it is absent."""

    def __init__(self, problem: str, unreadable: str | None = None, missing: bool = False) -> None:
        super().__init__(problem)
        self.problem = problem
        self.unreadable = unreadable
        self.missing = missing


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_file(path: Path, limit: int = MAX_FILE_BYTES, follow_links: bool = True) -> tuple[bytes, os.stat_result]:
    """The bytes of a regular file of at most `limit` bytes, and its status (for the callers that check
    its owner). With follow_links=False a symbolic link is refused."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)  # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise InputError("a symbolic link; give the file's own path") from None
        reason = exc.strerror or str(exc)
        raise InputError(f"cannot read: {reason}", unreadable=reason,
                         missing=exc.errno == errno.ENOENT) from None
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        os.close(fd)
        raise InputError(f"{_kind(status.st_mode)}, not a regular file; give a file that holds the content")
    with os.fdopen(fd, "rb") as file:
        if status.st_size > limit:
            raise InputError(f"larger than {_size(limit)} ({status.st_size} bytes), the limit for it")
        try:
            raw = file.read(limit + 1)  # bounded: the file may grow after the fstat
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise InputError(f"cannot read: {reason}", unreadable=reason) from None
    if len(raw) > limit:
        raise InputError(f"larger than {_size(limit)}, the limit for it")
    return raw, status


def read_text(path: Path, limit: int = MAX_FILE_BYTES, encoding: str = "utf-8") -> str:
    """The text of a regular file of at most `limit` bytes, decoded strictly."""
    raw, _ = read_file(path, limit)
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        raise InputError(f"not {encoding.upper()} text (byte {exc.start}); save it as {encoding.upper()}") from None


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 and limit % (1 << 20) == 0 else f"{limit} bytes"


def load_json(text: str | bytes) -> Any:
    """The value of a JSON text, nested at most MAX_DEPTH levels."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise InputError(f"nested too deeply (more than {MAX_DEPTH} levels)") from None
    except ValueError as exc:
        raise InputError(f"not valid JSON ({exc})") from None
    _check_depth(value)
    return value


def load_yaml(text: str) -> Any:
    """The value of a YAML text (JSON is YAML too) read with PyYAML's safe loader, its aliases expanding
    to at most MAX_EXPANDED, none referring to a node that holds it, nested at most MAX_DEPTH levels."""
    import yaml  # only where YAML is read: `exporter serve` without a file does without PyYAML

    try:
        value = yaml.load(text, Loader=_loader())  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise InputError(f"not valid YAML: {exc}") from None
    except (ValueError, ArithmeticError, LookupError, TypeError, AttributeError) as exc:
        # A scalar PyYAML's constructors fail on with their own errors: 2001-02-30, `!!int` or `!!timestamp` empty.
        raise InputError(f"not valid YAML: a value it cannot take ({type(exc).__name__}: {exc})") from None
    except RecursionError:
        raise InputError(f"nested too deeply (more than {MAX_DEPTH} levels)") from None
    _check_depth(value)
    return value


def _check_depth(value: Any) -> None:
    """Refuse a value nested deeper than MAX_DEPTH (iteratively: the check itself never recurses)."""
    level = [value] if isinstance(value, (dict, list)) else []  # the containers at one depth
    for _ in range(MAX_DEPTH):
        level = [child for item in level for child in (item.values() if isinstance(item, dict) else item)
                 if isinstance(child, (dict, list))]
        if not level:
            return
    raise InputError(f"nested too deeply (more than {MAX_DEPTH} levels)")


_LOADER: Any = None


def _loader() -> Any:
    """yaml.SafeLoader, checking each composed document's expanded size before anything is built from it."""
    global _LOADER
    if _LOADER is None:
        import yaml

        class BoundedLoader(yaml.SafeLoader):
            def compose_node(self, parent: Any, index: Any) -> Any:
                if self.check_event(yaml.AliasEvent):
                    self.aliased = True
                return super().compose_node(parent, index)

            def compose_document(self) -> Any:
                self.aliased = False
                node = super().compose_document()
                if self.aliased:  # without aliases a document is no larger than its text
                    _check_expansion(node, yaml)
                return node

        _LOADER = BoundedLoader
    return _LOADER


def _check_expansion(root: Any, yaml: Any) -> None:
    """The size of the document with every alias expanded (a scalar counts its length, a collection one
    plus its members), each shared node sized once (depth first, without recursion)."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        children = [] if isinstance(node, yaml.ScalarNode) else (
            [part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) else node.value)
        if finished:
            on_path.discard(key)
            size = max(1, len(node.value)) if isinstance(node, yaml.ScalarNode) else \
                1 + sum(sizes[id(child)] for child in children)
            if size > MAX_EXPANDED:
                raise InputError(f"its YAML aliases expand to more than {_size(MAX_EXPANDED)}; write the values "
                                 "out or use fewer aliases")
            sizes[key] = size
        elif key not in sizes:
            if key in on_path:
                raise InputError("a YAML alias refers to a node that holds it (a recursive structure); "
                                 "write the value out")
            on_path.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in children)
