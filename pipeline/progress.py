"""tqdm progress bars that stay quiet when stderr is not a terminal (CI, DVC logs, tests)."""

from __future__ import annotations

import sys
from typing import Any, Iterable


def progress(iterable: Iterable | None = None, **kwargs: Any):
    from tqdm.auto import tqdm

    kwargs.setdefault("disable", not sys.stderr.isatty())
    kwargs.setdefault("leave", False)
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, **kwargs)
