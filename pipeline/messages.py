"""How an error message shows a value it was given: on one line and short, so that the message's "expected" part
survives however long the value is (the CLI cuts an error at 600 characters; Python's ``str()`` refuses an
integer of more than 4300 digits, so a huge integer cannot even be printed).

The one-line errors that echo a value they were given show it through :func:`brief` or :func:`brief_list`;
:func:`unlikely_measurements` finds the columns that the warnings about features like a time or a label name.
Nothing here changes a result (dvc.yaml does not list this module).
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


def listed(items: Iterable[Any], most: int = 6) -> str:
    """The first ``most`` of ``items``, comma-separated, and how many more: ``a, b, c and 4 more`` (a note's or an
    error's list of names)."""
    items = [str(x) for x in items]
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def brief_list(values: Iterable[Any], most: int = 10, each: int = 40) -> str:
    """The first ``most`` of ``values``, each by :func:`brief` cut to ``each`` characters, comma-separated, and
    how many there are when some are left out: ``'a', 'b', ... (25 in all)``."""
    values = list(values)
    shown = ", ".join(brief(v, each) for v in values[:most])
    return shown + (f", ... ({len(values)} in all)" if len(values) > most else "")


def unlikely_measurements(values: Any, lengths: Any) -> list[tuple[int, str]]:
    """The feature columns of ``values`` that look like no measurement, each as (column, why), for the warnings of a
    custom source (features taken by default) and of ``fit_model``: a column that increases within every trajectory
    of 3 rows or more (at least two of them: a time stamp or a row counter), or one that is constant within each
    trajectory but not across them (an id or a label, such as a room number). They stay features (a counter can be
    one): the caller warns. ``values``: (rows, features), trajectory after trajectory, each in step order;
    ``lengths``: rows per trajectory."""
    import numpy as np

    values, lengths = np.asarray(values), np.asarray(lengths, dtype=np.int64)
    values = values.reshape(len(values), -1)
    same = np.repeat(np.arange(lengths.size), lengths)
    same = same[1:] == same[:-1]                   # interval between two rows of one trajectory
    if not same.any():
        return []
    long_intervals = same & np.repeat(lengths >= 3, lengths)[1:]
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    found = []
    for j in range(values.shape[1]):
        d = np.diff(values[:, j])
        if int((lengths >= 3).sum()) >= 2 and (d[long_intervals] > 0).all():
            found.append((j, "increases within every trajectory, like a time"))
        elif lengths.size >= 2 and (d[same] == 0).all() and np.unique(values[starts, j]).size > 1:
            found.append((j, "constant within each trajectory, like a label"))
    return found


#: a training feature whose mean or standard deviation exceeds this in absolute value is in large units
UNSTANDARDISED_SCALE = 10.0
#: and one whose standard deviation is below this (but not a constant column, which is left alone) in small ones
SMALL_SCALE = 0.01


def odd_units(values: Any, names: Any = None) -> tuple[str | None, str | None]:
    """The features of ``values`` (rows, features) in large units and in small ones, each shown as "feature 'pos'
    (mean 1013, std 9.134), ..." (at most three, then how many more; by position without ``names``), or None:
    SGD at the paper's learning rate 1 on a feature near 1013 (a pressure in hPa) diverges or wanders where the
    standardised one trains, and on one of std 0.01 barely moves, the gradients scaling with the square of the
    units. For the warnings of ``fit_model`` (arrays taken as they are) and of a custom source with
    ``normalize: false``."""
    import numpy as np

    x = np.asarray(values, dtype=np.float64)
    x = x.reshape(len(x), -1)
    with np.errstate(over="ignore", invalid="ignore"):
        mean, std = x.mean(axis=0), x.std(axis=0)

    def shown(which: Any) -> str | None:
        if not which.size:
            return None
        text = ", ".join(f"feature {j if names is None else brief(names[j])} (mean {mean[j]:.4g}, std {std[j]:.4g})"
                         for j in which[:3])
        return text + (f" and {which.size - 3} more" if which.size > 3 else "")

    constant = x.max(axis=0) == x.min(axis=0)   # its std is the rounding of its mean (0.3: 1e-15), not 0
    return (shown(np.flatnonzero((np.abs(mean) > UNSTANDARDISED_SCALE) | (std > UNSTANDARDISED_SCALE))),
            shown(np.flatnonzero(~constant & (std < SMALL_SCALE))))
