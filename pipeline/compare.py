"""``psrnn compare``: the numbers of one report summary against another's, e.g. your ``reports/summary.json``
against a reference snapshot in ``docs/reference/`` (README, "Reference results"), with a verdict per number.

A summary is the report stage's DVC metrics file, ``{dataset: {variant: {key: number}}}``
(:func:`pipeline.report.summary`). Every number two summaries share is compared, and gets one of:

* ``same``: equal to :data:`SAME_RTOL` relative. On one machine a rerun gives every number to the last digit, and
  on another CPU the baselines trained in torch agree to ~1e-8.
* ``close``: equal to ``rtol`` relative (default :data:`CLOSE_RTOL`). The C recurrence is built for the CPU it runs
  on (``-march=native``) and rounds as its vector width does, which moved the epoch-0 metrics of the
  2SR-initialised models by up to 5.3e-4 relative between an Intel Xeon and an AMD EPYC (17 more of PTB's 124774
  test characters predicted right by one model; one character is 3e-5 of its accuracy, relative).
* ``within spread``: a final test metric whose two means differ by more, but by no more than the sum of their seed
  standard deviations (the two ranges mean ± std overlap): the most a run on another CPU can be held to where
  SGD amplifies rounding (the factorized PSRNNs; the 2SR-initialised models on the continuous sets at lr 1).
* ``other seeds``: the seed count itself, and an epoch-0 metric (or a count of finite seeds), of a row whose seed
  counts differ, e.g. a one-seed run against the two-seed reference, or whose seeds differ (seeds 0 and 1 against
  2 and 3, where both summaries keep each seed's values): the count is a setting, not a result, and the
  epoch-0 metric a mean over other 2SR draws, not comparable. Where both summaries keep each seed's values
  (``test_bpc@s0``, ``init_test_bpc@s0``: summaries written since the report does), such a row is compared seed by
  seed instead, for the seeds both ran: the same seed's epoch-0 metric (the same 2SR draw) and final metrics are
  then judged as any other number, the final ones against the other side's spread. Without them, its final test
  metrics (one seed's against a mean of others) are still judged by the spread, and a note says so.
* ``other lr``: a final test metric of a row whose learning rate (``lr``) differs: another training from the same
  start; its epoch-0 metrics are still compared.
* ``differs``: anything else, including a parameter count or a count of finite seeds that is not exactly equal, a
  Bayes-optimal value or a naive predictor's metric (the data or the model are not the same) that is not the
  ``same``, whatever ``rtol``, and a learning rate (``lr``, compared where both summaries have it; a note counts
  the rows where one side does not) that is not exactly equal.

A variant or dataset in one summary only is listed as such. Derived numbers (``gap_*``, the difference of a
final metric and the Bayes-optimal value; ``*_data_units``, the same test errors as ``test_mse`` in the data's units
on standardised data, which snapshots made before evaluate wrote them lack), the standard deviations themselves,
and the per-seed values of rows of equal seed counts (their means are compared) are not compared on their own.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pipeline.messages import listed

#: the relative difference up to which two numbers are the same: a rerun on one machine is equal to the last digit,
#: and on another CPU the baselines trained in torch agree to ~1e-8 (the 2SR models' epoch-0 metrics: ``close``)
SAME_RTOL = 1e-6
#: the default relative difference of a ``close`` number: cross-CPU rounding of the epoch-0 metrics (README,
#: "Reference results")
CLOSE_RTOL = 1e-3
VERDICTS = ("same", "close", "within spread", "other seeds", "other lr", "differs", "only ours", "only reference")
#: the verdicts that are no difference (``--check`` passes on them; an ``lr`` that differs is one)
AGREEING = ("same", "close", "within spread", "other seeds", "other lr")
#: what joins a metric's key and a seed in a summary's per-seed values (``test_bpc@s0``; pipeline.report's)
SEED_KEY = "@s"
#: the reference snapshots a bare name stands for: ``docs/reference/<name>/summary.json`` of the project
REFERENCE_DIR = Path("docs") / "reference"
#: how a summary names the row of a naive predictor (``naive_unigram``: pipeline.report's)
NAIVE_ROW = "naive_"


@dataclass(frozen=True)
class Comparison:
    """One number of a (dataset, variant) row in the two summaries (None: missing on that side)."""
    dataset: str
    variant: str
    key: str
    ours: float | None
    reference: float | None
    verdict: str
    ours_std: float | None = None
    reference_std: float | None = None

    @property
    def relative(self) -> float | None:
        """(ours - reference) / |reference|; None where either is missing or the reference is 0."""
        if self.ours is None or self.reference is None or self.reference == 0:
            return None
        return (self.ours - self.reference) / abs(self.reference)


@dataclass
class SummaryComparison:
    rows: list[Comparison]
    only_ours: list[str]          # datasets in our summary only
    only_reference: list[str]     # datasets in the reference only
    unrated: int = 0              # rows of both whose learning rate one side does not record
    unmatched_seeds: list[str] = field(default_factory=list)   # "dataset variant (seed 2)": ours only, not compared
    shared: list[str] = field(default_factory=list)   # the datasets both hold
    # "dataset naive_bigram": a naive predictor's row on one side only (a yardstick the other summary predates, as
    # the Xeon snapshots predate the bigram): the data's, not a variant trained or lost, so not compared
    one_sided_naive: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {v: sum(r.verdict == v for r in self.rows) for v in VERDICTS}

    @property
    def agrees(self) -> bool:
        """Every shared number same, close, within spread, of other seeds or of another learning rate (the lr
        itself is a number that differs), every variant of a shared dataset on
        both sides (vacuously true when the summaries share no dataset: see :attr:`rows`)."""
        return all(r.verdict in AGREEING for r in self.rows)


def resolve_summary(value: str | Path | None, root: Path, *, reference: bool) -> Path:
    """The summary file ``value`` names: a file; a folder holding ``summary.json``; for the reference also the name
    of a snapshot in ``docs/reference/`` (``default``, ``continuous-lr``, ...). None: the project's
    ``reports/summary.json`` (ours) or ``docs/reference/default/summary.json`` (the reference)."""
    if value is None:
        return root / (REFERENCE_DIR / "default" if reference else Path("reports")) / "summary.json"
    path = Path(value)
    if path.is_dir():
        return path / "summary.json"
    if path.exists() or not reference or len(path.parts) != 1:
        return path
    named = root / REFERENCE_DIR / path / "summary.json"
    if named.is_file():
        return named
    have = sorted(p.parent.name for p in (root / REFERENCE_DIR).glob("*/summary.json"))
    raise FileNotFoundError(f"{value}: no such summary file, nor a reference snapshot {root / REFERENCE_DIR / path}; "
                            f"expected a summary.json path or one of: {', '.join(have) if have else 'none found'}")


def load_summary(path: Path, *, reference: bool = False) -> dict[str, dict[str, dict[str, float | None]]]:
    """A summary file, checked to be ``{dataset: {variant: {key: number or null}}}``; a missing or malformed file
    is a one-line error naming it (``reference``: the file was to be the reference, not a run's own)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        remedy = ("a reference snapshot's summary.json (docs/reference/<name>/ of a clone of psrnn-pipeline, or "
                  "--reference FILE)" if reference else
                  "the report stage's summary.json (run `dvc repro`, or name a file)")
        raise FileNotFoundError(f"{path}: file not found; expected {remedy}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    except OSError as exc:   # a directory, no permission: the file named, not "[Errno 21] ..."
        raise OSError(exc.errno, f"{path}: cannot read it ({exc.strerror or exc}); expected a summary.json file") \
            from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    except (ValueError, RecursionError) as exc:   # an integer of thousands of digits, arrays nested thousands deep
        raise ValueError(f"{path}: not a summary json can read ({' '.join(str(exc).split())[:100]})") from None
    expected = "expected {dataset: {variant: {key: number}}}, as the report stage's summary.json"
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a JSON {_json_type(data)}, not an object; {expected}")
    for ds, variants in data.items():
        if not isinstance(variants, dict):
            raise ValueError(f"{path}: {ds} is a JSON {_json_type(variants)}, not an object; {expected}")
        for v, row in variants.items():
            if not isinstance(row, dict):
                raise ValueError(f"{path}: {ds}.{v} is a JSON {_json_type(row)}, not an object; {expected}")
            for key, value in row.items():
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                    shown = json.dumps(value)
                    shown = shown if len(shown) <= 40 else shown[:37] + "..."
                    raise ValueError(f"{path}: {ds}.{v}.{key} is the JSON {_json_type(value)} {shown}, not a number; "
                                     f"{expected}")
                if isinstance(value, int) and not _fits_float(value):
                    raise ValueError(f"{path}: {ds}.{v}.{key} is an integer of {len(str(abs(value)))} digits, beyond "
                                     f"a float's range; {expected}")
    return data


def _json_type(value: Any) -> str:
    """What JSON calls the type of a value json.loads gave."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {dict: "object", list: "array", str: "string", int: "number", float: "number"}.get(type(value),
                                                                                          type(value).__name__)


def _fits_float(value: int) -> bool:
    try:
        float(value)
    except OverflowError:
        return False
    return True


def _within(a: float, b: float, rtol: float) -> bool:
    if a == b or (math.isnan(a) and math.isnan(b)):   # JSON read by Python takes NaN: a diverged run on both sides
        return True
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= rtol * max(abs(a), abs(b))


def _compared_keys(ours: Mapping[str, Any], ref: Mapping[str, Any]) -> list[str]:
    # lr only where both name it: a snapshot made before the report wrote it lacks it, which is no difference
    keys = (set(ours) | set(ref)) - ({"lr"} - (set(ours) & set(ref)))
    return sorted((k for k in keys if not (k.endswith("_std") or k.startswith("gap_") or "_data_units" in k
                                           or SEED_KEY in k)),
                  key=lambda k: (k != "seeds" and not k.startswith("test_"), k.startswith("init_"), k))


def _seeds(row: Mapping[str, Any], key: str) -> dict[int, Any]:
    """The per-seed values of ``key`` that a summary row keeps (``test_bpc@s0``: summaries since they do)."""
    head = f"{key}{SEED_KEY}"
    return {int(k[len(head):]): v for k, v in row.items()
            if k.startswith(head) and re.fullmatch(r"[0-9]+", k[len(head):])}


def _seeds_run(row: Mapping[str, Any]) -> set[int]:
    """The seeds whose final metrics a summary row keeps one by one."""
    return {int(m.group(1)) for k in row if (m := re.fullmatch(rf"test_.+{SEED_KEY}([0-9]+)", k))}


def _row(dataset: str, variant: str, ours: Mapping[str, Any], ref: Mapping[str, Any],
         rtol: float) -> list[Comparison]:
    out = []
    n_ours, n_ref = ours.get("seeds"), ref.get("seeds")
    ran_ours, ran_ref = _seeds_run(ours), _seeds_run(ref)
    # other seed counts, or as many seeds but others (where both keep each seed's values): means over other draws
    other_seeds = (n_ours is not None and n_ref is not None and n_ours != n_ref) or \
        bool(ran_ours and ran_ref and ran_ours != ran_ref)
    # another learning rate trains another model from the same start: its final metrics are not comparable
    other_lr = "lr" in ours and "lr" in ref and ours["lr"] != ref["lr"] and not (
        ours["lr"] is not None and ref["lr"] is not None and math.isnan(ours["lr"]) and math.isnan(ref["lr"]))

    def judge(key: str, a: Any, b: Any, sa: Any, sb: Any, has_spread: bool, by_seed: bool = False) -> str:
        if key == "seeds" and other_seeds:   # a setting, whatever --rtol
            return "other seeds"
        if other_lr and key.startswith("test_") and not (a is not None and b is not None
                                                          and _within(float(a), float(b), SAME_RTOL)):
            return "other lr"   # a diverged one (null) too: another training
        if a is None or b is None:
            return "differs"
        if key in ("lr", "n_params") or key.endswith("_finite"):   # settings and counts: 0.1 and 0.1001 are two
            if a == b or (math.isnan(a) and math.isnan(b)):
                return "same"
            return "other seeds" if key.endswith("_finite") and other_seeds and not by_seed else "differs"
        if _within(float(a), float(b), SAME_RTOL):
            return "same"
        if key.startswith("optimal_") or variant.startswith(NAIVE_ROW):   # the data's, not a model's: not close
            return "differs"
        if _within(float(a), float(b), rtol):
            return "close"
        if has_spread:   # a metric over seeds: its spread is the yardstick (of one seed on two CPUs too)
            spread = (sa or 0.0) + (sb or 0.0)
            return "within spread" if spread > 0 and abs(a - b) <= spread else "differs"
        if not by_seed and other_seeds and (key.startswith("init_") or key.endswith("_finite")):
            return "other seeds"
        return "differs"

    for key in _compared_keys(ours, ref):
        if key.endswith("_finite"):   # absent: every seed finite
            a, b = ours.get(key, ours.get("seeds")), ref.get(key, ref.get("seeds"))
        else:
            a, b = ours.get(key), ref.get(key)
        sa, sb = ours.get(f"{key}_std"), ref.get(f"{key}_std")
        if a is None and b is None:
            continue
        has_spread = f"{key}_std" in ours or f"{key}_std" in ref
        mine, theirs = (_seeds(ours, key), _seeds(ref, key)) if other_seeds else ({}, {})
        shared = sorted(set(mine) & set(theirs))
        if shared:   # other seed counts, the same seeds: seed by seed (a mean over other draws says nothing)
            for seed in shared:
                sa_, sb_ = mine[seed], theirs[seed]
                if sa_ is None and sb_ is None:
                    continue
                # the spread of whichever side has one (of both, where both do): the verdict does not depend on
                # which summary is ours
                out.append(Comparison(dataset, variant, f"{key}{SEED_KEY}{seed}", sa_, sb_,
                                      judge(key, sa_, sb_, sa, sb, has_spread, by_seed=True), sa, sb))
            continue
        out.append(Comparison(dataset, variant, key, a, b, judge(key, a, b, sa, sb, has_spread), sa, sb))
    return out


def compare_summaries(ours: Mapping[str, Mapping[str, Mapping[str, Any]]],
                      reference: Mapping[str, Mapping[str, Mapping[str, Any]]], *,
                      rtol: float = CLOSE_RTOL) -> SummaryComparison:
    """Every number of the datasets both summaries hold; a variant in one of them only is one row (key ``-``).
    ``rtol``: the relative difference up to which two numbers are ``close`` (>= :data:`SAME_RTOL`)."""
    if not (isinstance(rtol, (int, float)) and math.isfinite(rtol) and SAME_RTOL <= rtol < 1):
        raise ValueError(f"rtol {rtol!r}: expected a number from {SAME_RTOL:g} (same) to below 1")
    rows: list[Comparison] = []
    unrated = 0
    unmatched: list[str] = []
    one_sided_naive: list[str] = []
    for ds in sorted(set(ours) & set(reference)):
        for v in sorted(set(ours[ds]) | set(reference[ds])):
            if v.startswith(NAIVE_ROW) and (v not in reference[ds] or v not in ours[ds]):
                one_sided_naive.append(f"{ds} {v}")
            elif v not in reference[ds]:
                rows.append(Comparison(ds, v, "-", None, None, "only ours"))
            elif v not in ours[ds]:
                rows.append(Comparison(ds, v, "-", None, None, "only reference"))
            else:
                row = _row(ds, v, ours[ds][v], reference[ds][v], rtol)
                rows.extend(row)
                unrated += ("lr" in ours[ds][v]) != ("lr" in reference[ds][v])
                if any(SEED_KEY in r.key for r in row):   # compared seed by seed: which of ours were not
                    extra = sorted(_seeds_run(ours[ds][v]) - _seeds_run(reference[ds][v]))
                    if extra:
                        unmatched.append(f"{ds} {v} (seed{'s' if len(extra) > 1 else ''} "
                                         f"{', '.join(map(str, extra))})")
    return SummaryComparison(rows, sorted(set(ours) - set(reference)), sorted(set(reference) - set(ours)), unrated,
                             unmatched, sorted(set(ours) & set(reference)), one_sided_naive)


def _number(value: float | None, std: float | None) -> str:
    if value is None:
        return "-"
    text = f"{value:.6g}"
    return text + (f" ± {std:.2g}" if std is not None else "")


def format_comparison(result: SummaryComparison, ours: str, reference: str, *, show_all: bool = False) -> str:
    """The comparison as text: a header, a table of the numbers that are not the same (``show_all``: of every
    number) and a line of counts."""
    lines = [f"{ours} against {reference}"]
    # the seed count of a row of other seeds is a setting the line of counts reports; listed with --all only
    shown = [r for r in result.rows
             if show_all or (r.verdict != "same" and not (r.key == "seeds" and r.verdict == "other seeds"))]
    if shown:
        cells = [("dataset", "variant", "number", "ours", "reference", "rel. diff", "verdict")]
        for r in shown:
            rel = r.relative if r.key != "seeds" else None   # a count, not a measurement
            cells.append((r.dataset, r.variant, r.key, _number(r.ours, r.ours_std),
                          _number(r.reference, r.reference_std), "-" if rel is None else f"{rel:+.1e}", r.verdict))
        widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
        for c in cells:
            lines.append("  ".join(x.ljust(w) for x, w in zip(c, widths)).rstrip())
    counts = result.counts()
    n = sum(1 for r in result.rows if r.key != "-")
    summary = f"{n} numbers compared: " + ", ".join(f"{counts[v]} {v}" for v in ("same", "close", "within spread",
                                                                                  "differs"))
    # counted apart from the four above, which they are not among
    apart = [f"{counts[v]} {why}" for v, why in (("other seeds", "of other seeds"),
                                                 ("other lr", "of another learning rate")) if counts[v]]
    if apart:
        summary += f"; not comparable: {', '.join(apart)}"
    variants = [f"{counts[v]} variant(s) {v}" for v in ("only ours", "only reference") if counts[v]]
    if variants:
        summary += "; " + ", ".join(variants)
    if result.only_ours:
        summary += f"; datasets only in ours: {', '.join(result.only_ours)}"
    if result.only_reference:
        summary += f"; datasets only in the reference: {', '.join(result.only_reference)}"
    if not result.rows:
        summary += (" (the two summaries share no dataset)" if not result.shared else
                    f" (the datasets they share, {', '.join(result.shared)}, have no numbers on both sides)")
    lines.append(summary)
    if any(SEED_KEY in r.key and (r.ours_std is not None or r.reference_std is not None) for r in shown):
        # one seed has no spread of its own: the ± there would read as that seed's
        lines.append(f"note: ± beside one seed's number (a key ending in {SEED_KEY}<seed>) is the spread over the "
                     "seeds of its row's mean, the yardstick of 'within spread', not the seed's own")
    # exactly, both known: 56110 against 56103 is 'close' to the tolerance, and still another model
    other = sorted({f"{r.dataset} {r.variant}" for r in result.rows if r.key == "n_params" and r.ours is not None
                    and r.reference is not None and r.ours != r.reference})
    if other:   # another state_dim or n_features: another model, whose every number then differs
        lines.append(f"note: {len(other)} row(s) have another parameter count ({listed(other)}): those are other "
                     "models (params.yaml's sizes differ from the reference's), so their numbers are not comparable")
    rates = sorted({f"{r.dataset} {r.variant}" for r in result.rows if r.key == "lr" and r.verdict == "differs"}
                   - set(other))
    if rates:   # another train.lr or train.overrides: the same start, another training
        lines.append(f"note: {len(rates)} row(s) were trained at another learning rate ({listed(rates)}): their final "
                     "metrics are not comparable (\"other lr\"; their epoch-0 ones are)")
    if result.unrated:
        lines.append(f"note: {result.unrated} row(s) have a learning rate on one side only (a summary written before "
                     "the report recorded it): lr not compared there")
    # rows of other seed counts whose seeds could not be matched one by one (a summary without per-seed values):
    # a final metric of one seed is then held to the spread of the other side's mean, which it often exceeds
    other_counts = {(r.dataset, r.variant) for r in result.rows if r.key == "seeds" and r.verdict == "other seeds"}
    by_seed = {(r.dataset, r.variant) for r in result.rows if SEED_KEY in r.key}
    unmatched = sorted(f"{d} {v}" for d, v in other_counts - by_seed)
    if unmatched:
        lines.append(f"note: {len(unmatched)} row(s) of other seeds ({listed(unmatched)}) could not be "
                     "compared seed by seed (a summary without per-seed values, or no seed in common): their final "
                     "metrics are means over other seeds, held to the seed spread, which one seed often exceeds")
    if result.one_sided_naive:
        lines.append(f"note: {len(result.one_sided_naive)} naive predictor row(s) on one side only "
                     f"({listed(result.one_sided_naive)}): a yardstick the other summary predates, not compared")
    if result.unmatched_seeds:   # ours ran seeds the reference did not: their numbers were looked at by no one
        lines.append(f"note: {len(result.unmatched_seeds)} row(s) ran seeds the reference did not "
                     f"({listed(result.unmatched_seeds)}): compared seed by seed on the seeds both ran, those "
                     "seeds' numbers are not compared")
    return "\n".join(lines) + "\n"
