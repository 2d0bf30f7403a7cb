"""The entrypoint is one shell command line, as on PAI DLC: this module finds the line breaks that a
shell would treat as the end of a command (outside quotes, not escaped) and refuses them.

A scanner over the shell's quoting rules rather than a regex: a newline inside '...' or "..." is
part of an argument (an inline script `echo '<python>' > job.py && python job.py` is one command),
a backslash-newline continues the line, and a `#` comment ends at the newline.
"""

from __future__ import annotations

from dataclasses import dataclass

ADVICE = ("an entrypoint is one shell command line: join commands with `&&` or `;` "
          "(e.g. `pip install -r requirements.txt && python train.py`), or put them in a script "
          "in the working dir and run that")


class EntrypointError(ValueError):
    """The entrypoint is not one shell command line; the message says why and what to do."""


@dataclass(frozen=True)
class _Break:
    line: int  # 1-based number of the line that starts after the break
    text: str  # that line, for the message


def command_line_breaks(command: str) -> list[_Break]:
    """Lines that start a new command: after a newline outside quotes and not escaped, the next
    character that is neither blank nor the start of a comment begins another command line."""
    breaks: list[_Break] = []
    quote: str | None = None  # "'" or '"' while inside quotes
    line = 1
    after_newline = False  # an unquoted, unescaped newline was seen and no command text since
    at_word_start = True  # where `#` starts a comment
    i = 0
    while i < len(command):
        char = command[i]
        if quote is None and after_newline and char not in " \t\n" and char != "#":
            line_start = command.rfind("\n", 0, i) + 1
            line_end = command.find("\n", i)
            breaks.append(_Break(line, command[line_start:line_end if line_end >= 0 else None].strip()))
            after_newline = False
        if char == "\n":
            line += 1
        if quote == "'":
            if char == "'":
                quote = None
        elif quote == '"':
            if char == "\\":
                i += 1  # the next character is escaped; a backslash-newline joins lines
                line += command[i:i + 1] == "\n"
            elif char == '"':
                quote = None
        elif char == "\\":
            i += 1  # outside quotes too; backslash-newline is a line continuation
            line += command[i:i + 1] == "\n"
        elif char in "'\"":
            quote = char
        elif char == "#" and at_word_start:
            end = command.find("\n", i)
            i = len(command) if end < 0 else end
            continue
        elif char == "\n":
            after_newline = True
        at_word_start = quote is None and char in " \t\n;&|()"
        i += 1
    if quote is not None:
        raise EntrypointError(f"the entrypoint has an unterminated {quote} quote")
    return breaks


def validate_entrypoint(command: str) -> str:
    """The entrypoint with surrounding whitespace removed (YAML block scalars add a final newline),
    or EntrypointError when it is empty or holds several command lines."""
    command = command.strip()
    if not command:
        raise EntrypointError("the entrypoint is empty; give the command to run, e.g. `python train.py`")
    breaks = command_line_breaks(command)
    if breaks:
        first = breaks[0]
        shown = first.text if len(first.text) <= 60 else first.text[:57] + "..."
        raise EntrypointError(f"line {first.line} (`{shown}`) starts another command line; {ADVICE}")
    return command
