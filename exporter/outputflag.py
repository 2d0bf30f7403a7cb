"""`-o/--output` is the output format on every command that prints (as kubectl's `-o json`); a file a
command writes is `--out FILE`, a directory `--dir DIR`.

Commands where `-o`/`--output` named a file or directory keep taking that spelling for one release:
a value that is not one of the command's formats is taken as the path, with one deprecation line on
stderr naming the new flag. (A file literally named like a format needs --out.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click


def format_option(formats: Sequence[str] = ("text", "json"), *, legacy_path: bool = False) -> Callable:
    """`-o/--output FORMAT` (the first format is the default). With legacy_path, any other value is
    accepted too and read by `resolve` as the old path spelling."""
    kind: Any = str if legacy_path else click.Choice(list(formats))
    return click.option("-o", "--output", "output", type=kind, default=formats[0], show_default=True,
                        metavar="|".join(formats),
                        help="Output format." + (" (-o PATH, the old spelling of the path flag, still works "
                                                 "for one release.)" if legacy_path else ""))


def resolve(program: str, output: str, path: Path | None, formats: Sequence[str],
            new_flag: str) -> tuple[str, Path | None]:
    """(format, path) from `-o VALUE` and the new path flag: a value that is no format is the old spelling
    of `new_flag`, taken with one deprecation line; both spellings at once is a usage error."""
    if output in formats:
        return output, path
    if path is not None:
        raise click.UsageError(f"-o/--output is the output format ({'|'.join(formats)}); give the path once, "
                               f"with {new_flag}")
    click.echo(f"{program}: warning: -o/--output PATH is deprecated and goes in the next release; use "
               f"{new_flag} {output} (-o is the output format: {'|'.join(formats)})", err=True)
    return formats[0], Path(output)


def resolve_dir(program: str, output: str, directory: Path | None,
                formats: Sequence[str]) -> tuple[str, Path | None]:
    """`--dir DIR`, or the old `-o DIR` (one deprecation line); a file where the directory goes is refused."""
    output, directory = resolve(program, output, directory, formats, "--dir")
    if directory is not None and directory.exists() and not directory.is_dir():
        raise click.BadParameter(f"{directory} is a file, not a directory", param_hint="--dir")
    return output, directory


def echo_wrote(paths: Sequence[Path], output: str) -> None:
    """What a command wrote: a `wrote PATH` line each, or -o json's {"wrote": [...]}."""
    if output == "json":
        click.echo(json.dumps({"wrote": [str(path) for path in paths]}, indent=2))
    else:
        for path in paths:
            click.echo(f"wrote {path}")
