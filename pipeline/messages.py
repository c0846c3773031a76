"""How an error message shows a value it was given: on one line and short, so that the message's "expected" part
survives however long the value is (the CLI cuts an error at 600 characters; Python's ``str()`` refuses an
integer of more than 4300 digits, so a huge integer cannot even be printed).

The one-line errors that echo a value they were given show it through :func:`brief` or :func:`brief_list`;
nothing here changes a result (dvc.yaml does not list this module).
"""

from __future__ import annotations

import contextlib
import math
import shlex
from typing import Any, Iterable, Iterator

#: integers of more bits than this (from about 73 digits on) are described by their size ("an integer of about 101
#: digits"); shorter ones are printed whole
INT_SHOWN_BITS = 240
#: the most digits Python's str() prints by default (sys.get_int_max_str_digits); past it the size is estimated
_STR_DIGITS = 4300
#: the ``--root`` / ``--params`` options of the running ``psrnn`` command (:func:`command_options`), which the
#: commands that an error suggests repeat, so that they act on the same project and params file
_COMMAND_OPTIONS: list[str] = []


def psrnn_command(*words: Any) -> str:
    """The command line ``psrnn <words>`` as an error suggests it, with the running command's ``--root`` and
    ``--params`` (``psrnn --params k.yaml refine custom psrnn 0``): without them it would act on another file."""
    return " ".join(["psrnn", *_COMMAND_OPTIONS, *(str(w) for w in words)])


@contextlib.contextmanager
def command_options(root: str | None, params: str | None) -> Iterator[None]:
    """Within the block, :func:`psrnn_command` repeats these options (those given on the command line)."""
    before = list(_COMMAND_OPTIONS)
    _COMMAND_OPTIONS[:] = [f"--{k} {shlex.quote(str(v))}" for k, v in (("root", root), ("params", params)) if v]
    try:
        yield
    finally:
        _COMMAND_OPTIONS[:] = before


def brief(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (ending in "..."); an integer of more than
    :data:`INT_SHOWN_BITS` bits as "an integer of about N digits"."""
    if isinstance(value, int) and value.bit_length() > INT_SHOWN_BITS:
        estimate = int(value.bit_length() * math.log10(2)) + 1   # exact or one too many
        digits = len(str(abs(value))) if estimate < _STR_DIGITS else estimate
        return f"an integer of about {digits} digits"
    try:
        text = repr(value)
    except ValueError:   # a container holding an integer too long to print
        text = "[...]" if isinstance(value, (list, tuple)) else "{...}" if isinstance(value, dict) else \
            f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:max(limit - 3, 0)] + "..."


def brief_list(values: Iterable[Any], most: int = 10, each: int = 40) -> str:
    """The first ``most`` of ``values``, each by :func:`brief` cut to ``each`` characters, comma-separated, and
    how many there are when some are left out: ``'a', 'b', ... (25 in all)``."""
    values = list(values)
    shown = ", ".join(brief(v, each) for v in values[:most])
    return shown + (f", ... ({len(values)} in all)" if len(values) > most else "")
