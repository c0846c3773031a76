"""Several datasets of your own: `custom_<name>` sections, each prepared by its own copy of the preprocess_custom
stage (`psrnn custom-stage` prints it, `psrnn check` verifies it); every stage after preprocess takes them by name
from `datasets`."""

import copy
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.config import ParamsError, dump_yaml, is_custom, parse_params, read_yaml
from pipeline.data.schema import read_dataset

ROOT = Path(__file__).resolve().parents[1]


def _sales_section() -> dict:
    """A discrete dataset of one's own, beside the shipped continuous `custom`."""
    return {"source": {"path": "data/sales.parquet", "kind": "discrete", "symbol_column": "event",
                       "test_fraction": 0.25, "valid_fraction": 0.25, "seed": 0},
            "two_stage": {"n_features": 64, "state_dim": 4, "obs_dim": 3, "past_dim": 4, "past_window": 2,
                          "future_window": 2},
            "kf": None, "variants": ["psrnn", "gru"],
            "model": {"psrnn_bias_scale": 0.0, "factorized_bias_scale": 0.1},
            "train": {"epochs": 1, "lr": 1.0, "clip": 0.25, "bptt": 10, "batch_size": 4}}


def _write_sales(root: Path) -> None:
    rng = np.random.default_rng(3)
    events = rng.choice(["buy", "view", "leave"], size=8 * 30)
    (root / "data").mkdir(exist_ok=True)
    pq.write_table(pa.table({"trajectory": np.repeat(np.arange(8), 30), "event": events}),
                   root / "data" / "sales.parquet")


def test_custom_names():
    assert all(is_custom(n) for n in ("custom", "custom_sales", "custom_site_2", "custom_2024"))
    assert not any(is_custom(n) for n in ("customs", "custom_", "custom-sales", "custom_Sales", "custom__x",
                                          "my_custom", "ptb"))


def test_custom_sections_parse_beside_the_built_in_ones(defaults):
    raw = copy.deepcopy(defaults)
    raw["custom_sales"] = _sales_section()
    raw["datasets"] = ["custom_sales", "hmm", "custom"]
    p = parse_params(raw)
    assert list(p.datasets)[-2:] == ["custom", "custom_sales"] and p.selected == ["custom_sales", "hmm", "custom"]
    assert p.dataset("custom_sales").discrete and not p.dataset("custom").discrete
    with pytest.raises(ParamsError, match=r"^custom_sales\.source\.path: required"):
        parse_params({**raw, "custom_sales": {**_sales_section(), "source": {"kind": "discrete"}}})
    with pytest.raises(ParamsError, match=r"^custom_sales\.source\.lines: unknown key"):
        bad = _sales_section()
        bad["source"]["lines"] = 3
        parse_params({**raw, "custom_sales": bad})
    with pytest.raises(ParamsError, match=r"^custom-sales: unknown key in params\.yaml .*or custom_<name> for "
                                          r"another dataset of your own"):
        parse_params({**raw, "custom-sales": _sales_section()})
    with pytest.raises(ParamsError, match=r"^datasets: 'custom_stock' has no section in params\.yaml"):
        parse_params({**raw, "datasets": ["custom_stock"]})
    with pytest.raises(ParamsError, match=r"^datasets: unknown dataset 'stock'; expected some of .*custom_<name>"):
        parse_params({**raw, "datasets": ["stock"]})


def _project(tmp_path: Path, defaults) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    _write_sales(tmp_path)
    raw = copy.deepcopy(defaults)
    raw["custom_sales"] = _sales_section()
    raw["datasets"] = ["hmm", "custom_sales"]
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))


def test_custom_stage_prints_the_stage_and_check_wants_it_exact(tmp_path, defaults, capsys, monkeypatch):
    """`psrnn custom-stage custom_sales >> dvc.yaml` (README) appends the shipped preprocess_custom stage renamed
    where it names the dataset; `psrnn check` refuses the dataset without it, or with a copy renamed wrongly."""
    monkeypatch.delenv("PSRNN_DEBUG", raising=False)
    _project(tmp_path, defaults)
    dvc_yaml = tmp_path / "dvc.yaml"
    shipped = (ROOT / "dvc.yaml").read_text()
    dvc_yaml.write_text(shipped)

    def cli_run(*args: str) -> tuple[int, str, str]:
        code = cli.main(["--root", str(tmp_path), *args])
        out, err = capsys.readouterr()
        return code, out, err.strip()

    code, _, err = cli_run("check")
    assert code == 1 and err == (
        f"psrnn check: error: datasets: lists custom_sales, but {dvc_yaml} has no preprocess_custom_sales stage "
        "to prepare its file; expected the one `python -m pipeline.cli custom-stage custom_sales >> dvc.yaml` "
        "appends (README, 'Adding your own dataset')")
    # a top-level key after stages: (plots:) would receive the appended text: refused, nothing printed
    dvc_yaml.write_text(shipped + "\nplots:\n  - plots/extra.json\n")
    code, out, err = cli_run("custom-stage", "custom_sales")
    assert code == 1 and out == "" and "`stages:` is not its last top-level key (stages, plots)" in err
    dvc_yaml.write_text(shipped)
    code, stage_text, err = cli_run("custom-stage", "custom_sales")
    assert code == 0, err
    dvc_yaml.write_text(shipped + stage_text)                       # what `>> dvc.yaml` does
    stages = read_yaml(dvc_yaml.read_text())["stages"]
    template = stages["preprocess_custom"]
    stage = stages["preprocess_custom_sales"]
    assert stage["cmd"] == "python stages/preprocess.py custom_sales"
    assert stage["deps"] == ["${custom_sales.source.path}", *template["deps"][1:]]   # the code deps unchanged
    assert "pipeline/data/custom.py" in stage["deps"]
    assert stage["params"] == [p.replace("custom.", "custom_sales.", 1) for p in template["params"]]
    assert stage["outs"] == ["data/prepared/custom_sales.parquet"]
    assert list(stages)[:-1] == list(read_yaml(shipped)["stages"])            # the shipped ones untouched
    code, out, err = cli_run("check")
    assert code == 0, err
    assert "custom_sales: data/sales.parquet: discrete, 3 symbols, 4 train / 2 valid / 2 test trajectories" in out
    assert "valid (2 datasets: hmm, custom_sales;" in out

    # a copy made by replacing every "custom" renames the reader module too: refused, naming the field
    naive = dvc_yaml.read_text().replace(stage_text, stage_text.replace("data/custom.py", "data/custom_sales.py"))
    dvc_yaml.write_text(naive)
    code, _, err = cli_run("check")
    assert code == 1 and err.startswith(f"psrnn check: error: {dvc_yaml}: stage preprocess_custom_sales: deps is ")
    assert "'pipeline/data/custom_sales.py'" in err and err.endswith(
        "as `python -m pipeline.cli custom-stage custom_sales` prints it")

    dvc_yaml.write_text(shipped + stage_text)
    for name, message in (("custom_sales", f"{dvc_yaml}: has a preprocess_custom_sales stage already"),
                          ("custom", "custom: has its stage in dvc.yaml already"),
                          ("custom_stock", "custom_stock: no section in params.yaml; add it first")):
        code, out, err = cli_run("custom-stage", name)
        assert code == 1 and out == "" and err.startswith(f"psrnn custom-stage: error: {message}"), err


def test_a_custom_dataset_is_prepared_under_its_own_name(tmp_path, defaults):
    from pipeline.config import load_params
    from pipeline.workflow.data import prepare

    _project(tmp_path, defaults)
    params = load_params(tmp_path / "params.yaml")
    ds = prepare(params, tmp_path, "custom_sales")
    back = read_dataset(tmp_path / "data" / "prepared" / "custom_sales.parquet")
    assert back.vocab == ["buy", "leave", "view"] and ds.vocab == back.vocab
    assert (len(back.train), len(back.valid), len(back.test)) == (4, 2, 2)
    assert back.meta["source"] == "custom:sales.parquet"


def test_check_refuses_monitoring_a_validation_split_the_file_does_not_give(tmp_path, defaults, capsys, monkeypatch):
    monkeypatch.delenv("PSRNN_DEBUG", raising=False)
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    (tmp_path / "dvc.yaml").write_text((ROOT / "dvc.yaml").read_text())
    raw = copy.deepcopy(defaults)
    raw["datasets"] = ["custom"]
    raw["custom"]["train"]["overrides"]["kf"]["monitor"] = "valid"
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    assert cli.main(["--root", str(tmp_path), "check"]) == 1
    assert capsys.readouterr().err.strip() == (
        "psrnn check: error: custom.train.overrides.kf.monitor: 'valid', but examples/custom_series.parquet has no "
        "validation split; expected 'auto', 'train' or 'test' (or custom.source.valid_fraction > 0 or 'valid' rows "
        "in its split column)")
    raw["custom"]["source"]["valid_fraction"] = 0.2
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    assert cli.main(["--root", str(tmp_path), "check"]) == 0
    assert "custom: examples/custom_series.parquet: continuous, 2 features, 15 train / 5 valid / 5 test" in \
        capsys.readouterr().out


def test_readme_examples_of_your_own_data_run_as_printed(defaults, tmp_path, monkeypatch):
    """README "Adding your own dataset": the pandas recipe turns a CSV with an id column and time stamps into a file
    the preprocess reads, and the printed `custom_events` section is valid beside the defaults."""
    import pandas as pd
    from pipeline.config import read_yaml as _read_yaml
    from pipeline.data.custom import load_custom

    section = (ROOT / "README.md").read_text().split("### Adding your own dataset", 1)[1].split("\n### ", 1)[0]
    recipe = section.split("```python\n", 1)[1].split("```", 1)[0]
    recipe = "\n".join(line[3:] if line.startswith("   ") else line for line in recipe.splitlines())
    rng = np.random.default_rng(0)
    rows = [{"sensor_id": f"bldg-1/room{i}", "timestamp": f"2024-01-01 00:{10 * k:02d}:00",
             "temp_c": 20 + rng.normal(), "pressure_hpa": 1013 + rng.normal()} for i in range(4) for k in range(6)]
    pd.DataFrame(rows).to_csv(tmp_path / "sensors.csv", index=False)
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    exec(compile(recipe, "README recipe", "exec"), {})
    ds = load_custom(tmp_path / "data" / "sensors.parquet", kind="continuous", test_fraction=0.25)
    assert ds.features == ["temp_c", "pressure_hpa"] and len(ds.train) == 3 and len(ds.test) == 1
    yaml_block = section.split("```yaml\ncustom_events:", 1)[1].split("```", 1)[0]
    (tmp_path / "events.yaml").write_text("custom_events:" + yaml_block)
    raw = copy.deepcopy(defaults)
    raw.update(_read_yaml(tmp_path / "events.yaml"))
    raw["datasets"] = ["custom_events"]
    p = parse_params(raw)
    assert p.dataset("custom_events").discrete and p.selected == ["custom_events"]


def test_a_symbol_column_the_file_lacks_is_named_by_the_key_that_sets_it(tmp_path, defaults):
    """Preparing names the params key; predict's wording (--symbol-column) belongs to predict only."""
    from pipeline.config import load_params
    from pipeline.workflow.data import prepare

    _project(tmp_path, defaults)
    raw = read_yaml(tmp_path / "params.yaml")
    raw["custom_sales"]["source"]["symbol_column"] = "Event"
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    with pytest.raises(ValueError) as err:
        prepare(load_params(tmp_path / "params.yaml"), tmp_path, "custom_sales")
    assert str(err.value) == (f"{tmp_path / 'data' / 'sales.parquet'}: missing column 'Event' (the discrete "
                              "observation; set custom_sales.source.symbol_column in params.yaml to its name); "
                              "columns present: ['trajectory', 'event']")
