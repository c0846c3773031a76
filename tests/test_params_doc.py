"""docs/params.md lists every key that params.yaml accepts, in its section, with the defaults the code has.

The accepted keys are taken from the code, two ways: the structures the validator reads (the dataclass fields,
``_SOURCE_SCHEMA``, ``DEFAULT_FIGURES``, ``WIDTH_FAMILIES``) and, for the key sets that ``parse_params`` keeps in
local variables (top level, ``data``, ``tracking``, ``report``, a dataset section), by asking the validator itself:
an unknown key is refused with the list of the keys it expected. A key added to the code and not to the page fails
here. Fast: no torch, no data, no files written.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from pipeline.config import (_SOURCE_SCHEMA, DATASETS, DatasetParams, KalmanParams, ModelParams, ParamsError,
                             parse_params, read_yaml)
from pipeline.report import DEFAULT_FIGURES
from pipeline.train_config import TrainConfig
from pipeline.two_stage import WIDTH_FAMILIES, TwoStageConfig

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "params.md"
UNKNOWN = "zz_not_a_key"

#: dataclass fields that are not params.yaml keys: the 2SR's and the training's ``seed`` is the run seed, filled in
#: from ``seeds`` (the validator loads both sections with ``exclude=("seed",)``, so ``seed:`` there is an error)
NOT_KEYS = {"seed"}


# ------------------------------------------------------------------------------------------------ the page


def _text() -> str:
    return DOC.read_text(encoding="utf-8")


def _sections(text: str) -> dict[str, str]:
    """Every heading's text (without the #s) -> its body up to the next heading of the same or a higher level
    (subsections included). Lines inside fenced code blocks are never headings."""
    lines = text.splitlines()
    heads: list[tuple[int, int, str]] = []   # (line index, level, title)
    fenced = False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = re.match(r"(#{1,6}) (.+?)\s*$", line)
        if m and not fenced:
            heads.append((i, len(m.group(1)), m.group(2)))
    out = {}
    for n, (i, level, title) in enumerate(heads):
        end = next((j for j, lv, _ in heads[n + 1:] if lv <= level), len(lines))
        assert title not in out, f"docs/params.md: heading {title!r} appears twice"
        out[title] = "\n".join(lines[i + 1:end])
    return out


def _section(title: str) -> str:
    """The body of the heading ``title``, or of the one heading that starts with it."""
    sections = _sections(_text())
    if title in sections:
        return sections[title]
    found = [t for t in sections if t.startswith(title)]
    assert len(found) == 1, f"docs/params.md: expected one heading {title!r}, found {found or 'none'}"
    return sections[found[0]]


def _rows(section: str) -> dict[str, list[str]]:
    """The table rows of ``section`` whose first cell is one key in backticks: key -> the other cells."""
    rows = {}
    for line in section.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`([^`]+)`", cells[0])
        if m:
            assert m.group(1) not in rows, f"docs/params.md: two rows for `{m.group(1)}`"
            rows[m.group(1)] = cells[1:]
    return rows


def _default(section: str, key: str) -> object:
    """The default the page states for ``key``: the first backticked value of its row's default column (the third
    column, after type / allowed), read as YAML as params.yaml is."""
    rows = _rows(section)
    assert key in rows, f"docs/params.md: no table row for `{key}`"
    cells = rows[key]
    assert len(cells) == 3, f"docs/params.md: the row of `{key}` has {len(cells) + 1} cells; expected 4"
    m = re.search(r"`([^`]*)`", cells[1])
    assert m, f"docs/params.md: the default of `{key}` ({cells[1]!r}) has no value in backticks"
    return read_yaml(m.group(1))


def _same(documented: object, default: object) -> bool:
    if isinstance(default, bool) or isinstance(documented, bool):
        return documented is default
    return documented == default


def _assert_listed(title: str, keys, form: str = "`{}`") -> None:
    section = _section(title)
    missing = sorted(k for k in keys if form.format(k) not in section)
    assert not missing, f"docs/params.md, section {title!r}: keys accepted by the code but not listed: {missing}"


# ------------------------------------------------------------------------------------ the keys the code accepts


def _accepted(raw: dict) -> list[str]:
    """The keys the validator expected where ``raw`` puts ``UNKNOWN``: the list its unknown-key error gives."""
    with pytest.raises(ParamsError) as err:
        parse_params(raw)
    message = str(err.value)
    m = re.search(r"expected one of (\[[^\]]*\])", message)
    assert m and UNKNOWN in message, f"not an unknown-key error (has the message changed?): {message}"
    return list(ast.literal_eval(m.group(1)))


def _fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.name not in NOT_KEYS]


def test_top_level_keys_are_documented():
    keys = set(_accepted({UNKNOWN: 1})) | {"seeds", "datasets", "data", "tracking", "report", *DATASETS}
    _assert_listed("Top level", keys | {"custom_<name>"})


def test_data_tracking_report_keys_are_documented():
    _assert_listed("`data`", _accepted({"data": {UNKNOWN: 1}}))
    _assert_listed("`tracking`", _accepted({"tracking": {UNKNOWN: 1}}))
    _assert_listed("`report`", _accepted({"report": {UNKNOWN: 1}}))


def test_every_figure_and_its_options_are_documented():
    figures = set(_accepted({"report": {"figures": {UNKNOWN: True}}})) | set(DEFAULT_FIGURES)
    for fig in sorted(figures):
        options = set(_accepted({"report": {"figures": {fig: {UNKNOWN: 1}}}})) | set(DEFAULT_FIGURES[fig])
        _assert_listed(f"`report.figures.{fig}`", options)


def test_figure_defaults_match_the_report():
    for fig, options in DEFAULT_FIGURES.items():
        section = _section(f"`report.figures.{fig}`")
        for option, default in options.items():
            got = _default(section, option)
            assert _same(got, default), f"report.figures.{fig}.{option}: documented {got!r}, code {default!r}"


def test_dataset_section_keys_are_documented():
    for name in ("ptb", "swimmer", "custom_x"):   # one set for every dataset
        _assert_listed("Dataset sections", _accepted({name: {UNKNOWN: 1}}))


def test_source_keys_are_documented_per_source():
    for name in DATASETS:
        keys = set(_accepted({name: {"source": {UNKNOWN: 1}}})) | set(_SOURCE_SCHEMA[name])
        _assert_listed(f"`{name}.source`", keys)
    _assert_listed("`custom.source`", _accepted({"custom_x": {"source": {UNKNOWN: 1}}}))


def _source_readers() -> dict[str, list]:
    """The functions that each source's keys are passed to (pipeline.workflow.data._build), whose signature
    defaults are the defaults of the keys."""
    from pipeline.data.custom import load_custom
    from pipeline.data.handwriting import prepare_handwriting
    from pipeline.data.mocap import prepare_mocap
    from pipeline.data.ptb import prepare_ptb
    from pipeline.data.swimmer import load_authors_swimmer, simulate_swimmer
    from pipeline.data.synthetic import make_hmm_dataset, make_lgssm_dataset

    return {"ptb": [prepare_ptb], "swimmer": [simulate_swimmer, load_authors_swimmer], "mocap": [prepare_mocap],
            "handwriting": [prepare_handwriting], "hmm": [make_hmm_dataset], "lgssm": [make_lgssm_dataset],
            "custom": [load_custom]}


def test_source_defaults_match_the_data_modules():
    for name, readers in _source_readers().items():
        section = _section(f"`{name}.source`")
        for key in _SOURCE_SCHEMA[name]:
            if (name, key) == ("swimmer", "mode"):   # read by config and workflow.data, no function argument
                assert _default(section, key) == "simulate"
                continue
            params = [inspect.signature(f).parameters.get(key) for f in readers]
            defaults = [p.default for p in params if p is not None and p.default is not inspect.Parameter.empty]
            if not defaults:   # custom's path and kind: no default
                row = _rows(section).get(key)
                assert row is not None, f"docs/params.md: no table row for `{key}` in `{name}.source`"
                assert "required" in row[1], f"{name}.source.{key}: no default in the code; expected 'required'"
                continue
            got = _default(section, key)
            for default in defaults:   # swimmer's n_train is read by both modes: one default for both
                assert _same(got, default), f"{name}.source.{key}: documented {got!r}, code {default!r}"


def _assert_defaults(section: str, cls: type, name: str) -> None:
    """The defaults a section's table states for ``cls``'s fields (not NOT_KEYS) are the dataclass's."""
    for f in dataclasses.fields(cls):
        if f.name in NOT_KEYS:
            continue
        got = _default(section, f.name)
        assert _same(got, f.default), f"{name}.{f.name}: documented {got!r}, {cls.__name__} {f.default!r}"


def test_two_stage_keys_and_defaults():
    accepted = set(_accepted({"ptb": {"two_stage": {UNKNOWN: 1}}}))
    fields = set(_fields(TwoStageConfig))
    assert fields | {"layers"} == accepted, "two_stage: the validator's keys are TwoStageConfig's and layers"
    title = "`<dataset>.two_stage`"
    _assert_listed(title, accepted)
    families = set(_accepted({"ptb": {"two_stage": {"widths": {UNKNOWN: 1}}}})) | set(WIDTH_FAMILIES)
    _assert_listed(title, families, "`widths.{}`")
    section = _section(title)
    _assert_defaults(section, TwoStageConfig, "two_stage")
    layers = {f.name: f.default for f in dataclasses.fields(DatasetParams)}["layers"]
    assert _same(_default(section, "layers"), layers)
    for family in families:   # null: the median width
        assert _default(section, f"widths.{family}") is None


def test_train_keys_and_defaults():
    accepted = set(_accepted({"ptb": {"train": {UNKNOWN: 1}}}))
    assert set(_fields(TrainConfig)) | {"overrides"} == accepted, "train: TrainConfig's keys and overrides"
    override = set(_accepted({"ptb": {"variants": ["psrnn"], "train": {"overrides": {"psrnn": {UNKNOWN: 1}}}}}))
    assert override == set(_fields(TrainConfig)), "an override takes the train keys"
    title = "`<dataset>.train`"
    _assert_listed(title, accepted)
    section = _section(title)
    _assert_defaults(section, TrainConfig, "train")
    assert _default(section, "overrides") == {}


@pytest.mark.parametrize("cls,title,name", [(KalmanParams, "`<dataset>.kf`", "kf"),
                                            (ModelParams, "`<dataset>.model`", "model")])
def test_kf_and_model_keys_and_defaults(cls, title, name):
    accepted = set(_accepted({"swimmer": {name: {UNKNOWN: 1}}}))
    assert accepted == set(_fields(cls))
    _assert_listed(title, accepted)
    _assert_defaults(_section(title), cls, name)


def test_the_keys_dvc_needs_are_named():
    """Every params key dvc.yaml declares or interpolates (``${item}`` / ``${item.dataset}`` as ``<ds>``)."""
    from pipeline.cli import dvc_references

    stages = read_yaml((ROOT / "dvc.yaml").read_text())["stages"]
    keys = set()
    for stage in stages.values():
        body = stage.get("do", stage)
        for entry in body.get("params") or []:
            if isinstance(entry, str):
                keys.add(entry)
            elif isinstance(entry, dict):
                keys.update(k for k in (entry.get("params.yaml") or []) if isinstance(k, str))
        outer = {k: v for k, v in stage.items() if k in ("foreach", "matrix")}
        inner = {k: v for k, v in body.items() if k != "params"}
        keys.update(r for r in (*dvc_references(outer), *dvc_references(inner)) if not r.startswith("item"))
    keys = {re.sub(r"\$\{\s*item(\.dataset)?\s*\}", "<ds>", k) for k in keys}
    assert keys, "dvc.yaml: no params found"
    _assert_listed("Keys DVC needs", keys)


def test_lines_outside_tables_fit_120_characters():
    long = [n for n, line in enumerate(_text().splitlines(), 1) if len(line) > 120 and not line.startswith("|")]
    assert not long, f"docs/params.md: lines longer than 120 characters outside tables: {long}"
