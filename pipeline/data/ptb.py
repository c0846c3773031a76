"""Penn Treebank as a character stream, the paper's text benchmark.

Input: ``raw_dir/full/ptb.{train,valid,test}.txt`` (the standard Mikolov files; see ``PROVENANCE.md`` of the
mirror's ``ptb/`` folder, ``shared/data/ptb/`` here).
Each file is read as text (ASCII; line endings kept as they are) and cut to its first ``lines`` lines. The
paper's 120780 train / 124774 test characters are exactly the first **1001** lines, hence the default; the authors'
repository ships 1000-line files (120540 / 124645 characters).

Every character is a symbol, spaces and ``"\\n"`` included, as in the reference reader (``list(f.read())``). Each
split becomes ONE discrete trajectory. The vocabulary is the *sorted* set of characters of the training text
(``vocab_from="train"``; the reference reader orders by first appearance instead, which is only a relabelling), or
of all three splits (``vocab_from="all"``).

Valid/test characters absent from the training vocabulary (test has 7: ``# # 7 7 \\ / 6``; valid 4) are handled
by ``unknown``:

* ``"drop"`` (default, as the reference reader): removed; meta ``dropped_unknown`` gives the count per split;
* ``"map"``: mapped to an extra symbol ``"<unk>"`` appended to the vocabulary (always appended, so the vocabulary
  does not depend on the test text); meta ``mapped_unknown`` gives the count per split;
* ``"error"``: a :class:`ValueError` naming the split, the characters and their counts.

In every case meta ``unknown_chars`` maps each split to ``{character: count}`` of the unseen characters.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.schema import SPLITS, SequenceDataset
from pipeline.messages import brief

log = logging.getLogger(__name__)

UNKNOWN_RULES = ("drop", "map", "error")
VOCAB_SOURCES = ("train", "all")
UNK_SYMBOL = "<unk>"
PAPER_LINES = 1001


def first_lines(text: str, lines: int | None) -> tuple[str, int]:
    """The first ``lines`` lines of ``text`` (``"\\n"``-terminated, terminators kept) and how many there were.

    Only ``"\\n"`` ends a line (unlike :meth:`str.splitlines`, which also splits on form feeds and other separators).
    ``lines=None`` keeps everything.
    """
    total = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    if lines is None or lines >= total:
        return text, total
    pos = -1
    for _ in range(lines):
        pos = text.find("\n", pos + 1)
    return text[: pos + 1], lines


def _read(path: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: PTB file not found (fetch the 'ptb' dataset first)")
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            return fh.read()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8/ASCII text ({exc.reason} at byte {exc.start})") from None


def prepare_ptb(
    raw_dir: Path,
    *,
    lines: int | None = PAPER_LINES,
    vocab_from: str = "train",
    unknown: str = "drop",
) -> SequenceDataset:
    """Build the character-level PTB dataset (one trajectory per split) from ``raw_dir/full/``.

    ``lines`` is the number of leading lines kept from each file (``None``: all). See the module docstring for
    ``vocab_from`` and ``unknown``.
    """
    if unknown not in UNKNOWN_RULES:
        raise ValueError(f"unknown={brief(unknown)}: expected one of {UNKNOWN_RULES}")
    if vocab_from not in VOCAB_SOURCES:
        raise ValueError(f"vocab_from={brief(vocab_from)}: expected one of {VOCAB_SOURCES}")
    if lines is not None and (isinstance(lines, bool) or not isinstance(lines, (int, np.integer)) or lines < 1):
        raise ValueError(f"lines={brief(lines)}: expected a positive integer or None")
    raw_dir = Path(raw_dir)

    texts: dict[str, str] = {}
    line_counts: dict[str, int] = {}
    for split in SPLITS:
        path = raw_dir / "full" / f"ptb.{split}.txt"
        text, n = first_lines(_read(path), lines)
        if lines is not None and n < lines:
            log.warning("%s: only %d lines, fewer than the %d requested", path, n, lines)
        if not text:
            raise ValueError(f"{path}: file is empty")
        texts[split], line_counts[split] = text, n

    if vocab_from == "train":
        vocab = sorted(set(texts["train"]))
    else:
        vocab = sorted(set().union(*(set(t) for t in texts.values())))
    known = set(vocab)
    unknown_chars: dict[str, dict[str, int]] = {}
    for split in ("valid", "test"):
        counts = Counter(c for c in texts[split] if c not in known)
        unknown_chars[split] = dict(sorted(counts.items()))
    if unknown == "error":
        bad = {s: c for s, c in unknown_chars.items() if c}
        if bad:
            detail = "; ".join(f"{s}: " + ", ".join(f"{ch!r} x{n}" for ch, n in c.items()) for s, c in bad.items())
            raise ValueError(
                f"{raw_dir}: characters not in the {vocab_from} vocabulary (unknown='error'): {detail}; "
                "use unknown='drop' or 'map'"
            )

    meta: dict[str, Any] = {
        "source": "ptb",
        "lines": lines,
        "lines_read": line_counts,
        "vocab_from": vocab_from,
        "unknown": unknown,
        "unknown_chars": unknown_chars,
    }
    if unknown == "map":
        vocab = vocab + [UNK_SYMBOL]
        meta["mapped_unknown"] = {s: sum(c.values()) for s, c in unknown_chars.items()}
    elif unknown == "drop":
        meta["dropped_unknown"] = {s: sum(c.values()) for s, c in unknown_chars.items()}

    index = {ch: i for i, ch in enumerate(vocab)}
    unk = index.get(UNK_SYMBOL, -1) if unknown == "map" else -1
    trajs: dict[str, list[np.ndarray]] = {}
    for split in SPLITS:
        codes = np.fromiter((index.get(c, unk) for c in texts[split]), dtype=np.int64, count=len(texts[split]))
        if unknown == "drop":
            codes = codes[codes >= 0]
        trajs[split] = [codes]
        log.info("ptb %s: %d characters (%d lines)", split, len(codes), line_counts[split])
    return SequenceDataset(kind="discrete", vocab=vocab, meta=meta, **trajs)
