import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.report import collect_runs, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PTB_VARIANTS = ["lstm", "gru", "factorized_psrnn_r60", "factorized_psrnn_r20", "psrnn", "psrnn_2layer"]
SWIMMER_MODELS = ["kf", "rnn", "gru", "lstm", "psrnn"]
FAMILY = {"psrnn_2layer": "psrnn", "factorized_psrnn_r60": "factorized_psrnn",
          "factorized_psrnn_r20": "factorized_psrnn"}


def _write_run(root: Path, dataset: str, variant: str, seed: int, kind: str, curve: list[float], *,
               accuracy: list[float] | None = None, bayes: dict | None = None, n_params: int = 1000,
               history: bool = True, metrics: bool = True, extra: dict | None = None) -> None:
    key = "bpc" if kind == "discrete" else "mse"

    def m(i: int) -> dict:
        out = {key: curve[i]}
        if kind == "discrete":
            out["accuracy"] = accuracy[i] if accuracy else 0.5
        return out

    run = f"{variant}_s{seed}"
    common = {"dataset": dataset, "variant": variant, "family": FAMILY.get(variant, variant), "seed": seed,
              "kind": kind, "n_params": n_params}
    if history:  # refine's plot file: one row per epoch
        rows = [{"epoch": i, **{f"{split}_{k}": v for split in ("train", "test") for k, v in m(i).items()}}
                for i in range(len(curve))]
        p = root / "plots" / dataset / variant / f"s{seed}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(rows))
    if metrics:
        p = root / "metrics" / dataset / f"{run}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({**common, "epochs": len(curve) - 1, "best_epoch": len(curve) - 1,
                                 "test": m(len(curve) - 1), "initial_test": m(0), "bayes_optimal": bayes,
                                 **(extra or {})}))


def _write_predictions(root: Path, dataset: str, run: str, rng: np.random.Generator) -> None:
    rows = {"trajectory": [], "step": [], "feature": [], "target": [], "initial": [], "final": []}
    for traj in (3, 7):                       # smallest id is 3
        for feat in ("qvel_1", "qpos_0"):     # first sorted is qpos_0
            x = np.sin(np.arange(40) / 4.0 + traj)
            for step in range(1, 40):
                rows["trajectory"].append(traj)
                rows["step"].append(step)
                rows["feature"].append(feat)
                rows["target"].append(float(x[step]))
                rows["initial"].append(float(x[step - 1] + 0.3 * rng.standard_normal()))
                rows["final"].append(float(x[step] + 0.05 * rng.standard_normal()))
    table = pa.table({"trajectory": pa.array(rows["trajectory"], pa.int64()),
                      "step": pa.array(rows["step"], pa.int64()),
                      "feature": pa.array(rows["feature"], pa.string()),
                      "target": pa.array(rows["target"], pa.float64()),
                      "initial": pa.array(rows["initial"], pa.float64()),
                      "final": pa.array(rows["final"], pa.float64())})
    path = root / "predictions" / dataset / f"{run}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    rng = np.random.default_rng(0)
    # ptb: two seeds per variant; psrnn's final BPCs are 1.5 and 1.7 -> 1.600 ± 0.141 (sample std)
    finals = {"psrnn": (1.5, 1.7), "psrnn_2layer": (1.4, 1.45), "factorized_psrnn_r60": (1.8, 1.9),
              "factorized_psrnn_r20": (2.0, 2.2), "lstm": (2.1, 2.3), "gru": (2.05, 2.25)}
    for v in PTB_VARIANTS:
        for seed, final in zip((0, 1), finals[v]):
            curve = list(np.linspace(3.0 + seed * 0.1, final, 4))
            curve[-1] = final
            _write_run(root, "ptb", v, seed, "discrete", curve, accuracy=[0.2, 0.3, 0.4, 0.5 + 0.01 * seed],
                       n_params=5000)
    # swimmer: the five models of Fig. 4, one seed each, with prediction files
    for i, v in enumerate(SWIMMER_MODELS):
        _write_run(root, "swimmer", v, 0, "continuous", [10.0 - i, 5.0 - i * 0.5, 2.0 - i * 0.3], n_params=300)
        _write_predictions(root, "swimmer", f"{v}_s0", rng)
    # synthetic hmm with a Bayes-optimal value: gaps 1.0-0.8=0.2 and 1.2-0.8=0.4 -> 0.300 ± 0.141
    for seed, final in zip((0, 1), (1.0, 1.2)):
        _write_run(root, "hmm", "psrnn", seed, "discrete", [1.5, 1.1, final], bayes={"bpc": 0.8})
        _write_run(root, "hmm", "lstm", seed, "discrete", [2.0, 1.5, final + 0.5], bayes={"bpc": 0.8})
    # a run with metrics but no history (e.g. pulled from another machine): table only
    _write_run(root, "hmm", "gru", 0, "discrete", [1.9, 1.8], bayes={"bpc": 0.8}, history=False)
    return root


def _table_rows(md: str, dataset: str) -> list[list[str]]:
    section = md.split(f"## {dataset} (")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in rows]


def test_collect_runs(project: Path):
    runs = collect_runs(project)
    keys = [(r["dataset"], r["variant"], r["seed"]) for r in runs]
    assert keys == sorted(keys)
    assert len(runs) == 2 * len(PTB_VARIANTS) + len(SWIMMER_MODELS) + 5
    psrnn0 = next(r for r in runs if (r["dataset"], r["variant"], r["seed"]) == ("ptb", "psrnn", 0))
    assert psrnn0["kind"] == "discrete" and psrnn0["test"]["bpc"] == 1.5 and len(psrnn0["history"]) == 4
    gru = next(r for r in runs if (r["dataset"], r["variant"]) == ("hmm", "gru"))
    assert gru["history"] is None and gru["bayes_optimal"] == {"bpc": 0.8}
    assert all((r["predictions_path"] is not None) == (r["dataset"] == "swimmer") for r in runs)
    assert collect_runs(project / "nowhere") == []


def test_write_report(project: Path, tmp_path: Path):
    import matplotlib.image as mpimg

    out = tmp_path / "reports"
    result = write_report(project, out)
    expected = ["fig3a", "fig3b", "fig3c", "fig4a", "fig4b", "hmm_curves", "ptb_curves", "swimmer_curves"]
    assert sorted(result["written"]) == sorted([f"figures/{n}.png" for n in expected] + ["results.md",
                                                                                          "summary.json"])
    assert result["skipped"] == []
    for name in expected:
        path = out / "figures" / f"{name}.png"
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000
        img = mpimg.imread(path)
        assert img.ndim == 3 and img.shape[2] in (3, 4) and min(img.shape[:2]) > 100
        assert float(img[..., :3].std()) > 0.0  # not blank
    assert not list(out.rglob(".*.tmp")) and not list(out.rglob(".*.png"))  # no leftover temporaries

    md = (out / "results.md").read_text()
    # hand-computed: mean(1.5, 1.7) = 1.6, sample std = sqrt(0.02) = 0.1414
    ptb = {row[0]: row for row in _table_rows(md, "ptb")}
    assert ptb["`psrnn`"][1] == "2"
    assert "1.600 ± 0.141" in ptb["`psrnn`"][3]
    assert ptb["`psrnn`"][4] == "0.505 ± 0.007"          # accuracies 0.50, 0.51
    assert ptb["`psrnn`"][5] == "3.050"                  # epoch-0 BPC mean of 3.0 and 3.1
    assert ptb["`psrnn`"][2] == "5,000"
    order = [row[0] for row in _table_rows(md, "ptb")]
    assert order == ["`psrnn_2layer`", "`psrnn`", "`factorized_psrnn_r60`", "`factorized_psrnn_r20`", "`gru`",
                     "`lstm`"]
    # continuous table sorted by MSE: psrnn (2.0-1.2=0.8) first, kf (2.0) last; single seed shows no ± term
    swim = _table_rows(md, "swimmer")
    assert [r[0] for r in swim] == ["`psrnn`", "`lstm`", "`gru`", "`rnn`", "`kf`"]
    assert swim[0][3] == "0.800" and swim[-1][3] == "2.000"
    # Bayes-optimal gap for the synthetic dataset
    assert "Bayes-optimal test BPC: 0.800" in md
    hmm = {row[0]: row for row in _table_rows(md, "hmm")}
    assert hmm["`psrnn`"][-1] == "0.300 ± 0.141"
    assert hmm["`lstm`"][-1] == "0.800 ± 0.141"
    assert hmm["`gru`"][-1] == "1.000"                   # metrics without history still in the table
    assert [r[0] for r in _table_rows(md, "hmm")] == ["`psrnn`", "`lstm`", "`gru`"]
    header = md.split("## hmm (")[1].splitlines()[4]
    assert "gap to optimal" in header
    assert "gap to optimal" not in md.split("## ptb (")[1].split("\n## ")[0]
    # the same numbers as a DVC metrics file
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary) == ["hmm", "ptb", "swimmer"] and sorted(summary["ptb"]) == sorted(PTB_VARIANTS)
    ps = summary["ptb"]["psrnn"]
    assert ps["seeds"] == 2 and ps["n_params"] == 5000
    assert ps["test_bpc"] == pytest.approx(1.6) and ps["test_bpc_std"] == pytest.approx(0.02 ** 0.5)
    assert ps["test_accuracy"] == pytest.approx(0.505) and ps["init_test_bpc"] == pytest.approx(3.05)
    assert "optimal_bpc" not in ps and "test_mse" not in ps
    assert summary["swimmer"]["kf"] == {"seeds": 1, "test_mse": 2.0, "test_mse_std": None, "init_test_mse": 10.0,
                                        "test_mse@s0": 2.0, "init_test_mse@s0": 10.0, "n_params": 300}
    # each seed's own values, for psrnn compare of a run of other seeds
    assert (ps["test_bpc@s0"], ps["test_bpc@s1"]) == pytest.approx((1.5, 1.7))

    hmm_ps = summary["hmm"]["psrnn"]
    assert hmm_ps["optimal_bpc"] == pytest.approx(0.8) and hmm_ps["gap_bpc"] == pytest.approx(0.3)
    assert summary["hmm"]["gru"]["gap_bpc"] == pytest.approx(1.0)
    # figure links and "Not available"
    assert "[fig3a.png](figures/fig3a.png)" in md
    na = md.split("## Not available")[1]
    assert "mocap" in na and "handwriting" in na
    assert "plots/hmm/gru/s0.json" in na
    # deterministic
    first_md = (out / "results.md").read_bytes()
    first_summary = (out / "summary.json").read_bytes()
    first_png = (out / "figures" / "fig4b.png").read_bytes()
    write_report(project, out)
    assert (out / "results.md").read_bytes() == first_md
    assert (out / "summary.json").read_bytes() == first_summary
    assert (out / "figures" / "fig4b.png").read_bytes() == first_png
    assert not re.search(r"\d{4}-\d{2}-\d{2}", first_md.decode())
    assert str(project) not in first_md.decode()


def test_metrics_of_another_shape_leave_the_run_out_saying_so(tmp_path: Path, caplog):
    """A metrics file holding valid JSON of another shape ([] ) dropped its run from summary.json without a word
    on stderr (unreadable JSON was warned about)."""
    root = tmp_path / "project"
    _write_run(root, "lgssm", "gru", 0, "continuous", [1.0, 0.5])
    _write_run(root, "lgssm", "psrnn", 0, "continuous", [1.0, 0.4])
    (root / "metrics" / "lgssm" / "gru_s0.json").write_text("[]")
    with caplog.at_level("WARNING", logger="pipeline.report"):
        write_report(root, tmp_path / "reports")
    assert "report: metrics/lgssm/gru_s0.json is not a JSON object (a list): its run is left out" in caplog.text
    assert "`metrics/lgssm/gru_s0.json`: not a JSON object; run left out" in \
        (tmp_path / "reports" / "results.md").read_text()


def test_missing_data_is_skipped_not_fatal(tmp_path: Path):
    root = tmp_path / "project"
    # only swimmer with kf and psrnn, no predictions for psrnn; ptb has only lstm
    _write_run(root, "swimmer", "kf", 0, "continuous", [3.0, 2.0])
    _write_run(root, "swimmer", "psrnn", 0, "continuous", [1.0, 0.5])
    _write_predictions(root, "swimmer", "kf_s0", np.random.default_rng(1))
    _write_run(root, "ptb", "lstm", 0, "discrete", [3.0, 2.0])
    (root / "metrics" / "ptb" / "broken_s0.json").write_text("{not json")
    _write_run(root, "custom", "psrnn", 0, "continuous", [1.0, 0.5], metrics=False)  # still training
    out = tmp_path / "reports"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "fig3b.png").write_bytes(b"stale")  # from an earlier report
    result = write_report(root, out)
    assert "figures/fig3a.png" in result["written"]        # drawn with lstm only
    assert {"figures/fig3b.png", "figures/fig3c.png"} <= set(result["skipped"])
    assert not (out / "figures" / "fig3b.png").exists()
    assert "figures/fig4a.png" in result["written"] and "figures/fig4b.png" in result["written"]
    md = (out / "results.md").read_text()
    na = md.split("## Not available")[1]
    assert "`gru`" in na and "`factorized_psrnn_r60`" in na    # missing from fig3a
    assert "psrnn_2layer" in na and "mocap" in na and "handwriting" in na
    assert "broken_s0.json" in na
    assert "no prediction file for `psrnn`" in na
    assert "fig3b.png" not in md.split("## Figures")[1].split("## Not available")[0]
    assert "figures/custom_curves.png" in result["written"]
    assert "## custom\n\nNo final metrics" in md
    # an empty root does not crash either
    empty = write_report(root / "nothing", tmp_path / "empty")
    assert empty["written"] == ["results.md", "summary.json"]
    assert "No runs found." in (tmp_path / "empty" / "results.md").read_text()


def test_figure_config_overrides(project: Path, tmp_path: Path):
    out = tmp_path / "reports"
    result = write_report(project, out, figures={
        "fig3a": ["lstm", "gru"], "fig3b": False, "fig3c": None, "fig4a": False,
        "fig4b": {"feature": "qvel_1", "trajectory": 7}, "per_dataset": {"enabled": False}})
    assert result == {"written": ["figures/fig3a.png", "figures/fig4b.png", "results.md", "summary.json"], "skipped": []}
    md = (out / "results.md").read_text()
    assert "feature qvel_1" not in md and "factorized_psrnn_r60" not in md.split("## Not available")[1]
    with pytest.raises(ValueError, match="unknown figure"):
        write_report(project, out, figures={"fig5": {}})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['feture'\], did you mean 'feature'\?; known: "):
        write_report(project, out, figures={"fig4b": {"feture": "x"}})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['feture', 'trajectori'\]; did you mean 'feature' "
                                         r"for 'feture', 'trajectory' for 'trajectori'\?; known: "):
        write_report(project, out, figures={"fig4b": {"trajectori": 1, "feture": "x"}})
    off = {k: False for k in ("fig3a", "fig3b", "fig3c", "fig4a", "per_dataset")}
    res = write_report(project, tmp_path / "r2", figures={**off, "fig4b": {"trajectory": 99}})
    assert res == {"written": ["results.md", "summary.json"], "skipped": ["figures/fig4b.png"]}
    assert "figures/fig4b.png" in res["skipped"]
    assert ("- `fig4b.png`: trajectory 99 is not among the test trajectories on `swimmer` (" in
            (tmp_path / "r2" / "results.md").read_text())
    # a feature name the data do not have is named with the ones they have, not taken for missing data
    res = write_report(project, tmp_path / "r3", figures={**off, "fig4b": {"feature": "qvel_9"}})
    assert res["skipped"] == ["figures/fig4b.png"]
    md = (tmp_path / "r3" / "results.md").read_text()
    assert "- `fig4b.png`: feature `qvel_9` is not in the predictions on `swimmer`; `report.figures.fig4b.feature` " \
           "expects one of `" in md and "`qvel_1`" in md and "has no predictions" not in md


def test_report_shows_only_the_datasets_listed(project: Path, tmp_path: Path):
    """params `datasets` without swimmer and hmm: their outputs stay on disk (no stage owns them any more) and are
    left out of the table, the summary and every figure; fig4a/4b, which draw continuous sets only, are skipped."""
    out = tmp_path / "reports"
    write_report(project, out)
    assert (out / "figures" / "swimmer_curves.png").is_file()
    assert set(json.loads((out / "summary.json").read_text())) == {"ptb", "swimmer", "hmm"}
    result = write_report(project, out, datasets=["ptb"])   # into the same folder: no stale per-dataset figure
    assert sorted(p.name for p in (out / "figures").glob("*_curves.png")) == ["ptb_curves.png"]
    assert {"figures/fig4a.png", "figures/fig4b.png"} <= set(result["skipped"])
    assert "figures/ptb_curves.png" in result["written"]
    assert not {"figures/swimmer_curves.png", "figures/hmm_curves.png"} & set(result["written"])
    md = (out / "results.md").read_text()
    assert "## ptb" in md and "## swimmer" not in md and "## hmm" not in md
    assert set(json.loads((out / "summary.json").read_text())) == {"ptb"}
    # a figure of a dataset left off the list says so, rather than "no runs" (the runs are there)
    assert "- `fig4b.png`: `swimmer` not in `datasets` (params.yaml)\n" in md   # no continuous set to suggest
    _write_run(project, "lgssm", "gru", 0, "continuous", [1.0, 0.5])   # a continuous set to draw it on
    write_report(project, out, datasets=["ptb", "hmm", "lgssm"])
    md = (out / "results.md").read_text()
    assert ("- `fig4b.png`: `swimmer` not in `datasets` (params.yaml); `report.figures.fig4b.dataset` draws it on "
            "another (`dvc exp run report -S '+report.figures.fig4b.dataset=lgssm'`)") in md
    assert "- `fig4a.png`: `swimmer`, `mocap`, `handwriting` not in `datasets` (params.yaml)" in md
    assert "no runs for dataset" not in md
    # the sections follow the order of `datasets` (the paper's sets first), not the alphabet
    write_report(project, out, datasets=["swimmer", "ptb", "hmm"])
    md = (out / "results.md").read_text()
    assert md.index("## swimmer") < md.index("## ptb") < md.index("## hmm")


def test_the_table_names_runs_stopped_early_or_scored_at_their_best_epoch(tmp_path: Path):
    root = tmp_path / "project"
    _write_run(root, "lgssm", "gru", 0, "continuous", [1.0, 0.5, 0.6, 0.7],
               extra={"stopped_early": "valid mse did not improve for 2 epochs", "model_epoch": 1})
    _write_run(root, "lgssm", "gru", 1, "continuous", [1.0, 0.5, 0.6, 0.4], extra={"model_epoch": 3})
    _write_run(root, "lgssm", "lstm", 0, "continuous", [1.0, 0.9, 0.8, 0.75], extra={"model_epoch": 2})
    write_report(root, tmp_path / "reports")
    md = (tmp_path / "reports" / "results.md").read_text()
    assert ("Schedule (`train.patience`, `train.restore_best`): `gru` seed 0 stopped early after epoch 3 and "
            "scored with epoch 1's weights; `lstm` seed 0 scored with epoch 2's weights. A star on a figure's curve "
            "marks the scored epoch's value (the mean over the seeds scored with that epoch), where it is not the "
            "curve's last point.\n") in md


def test_the_table_shows_learning_rates_only_where_variants_differ(tmp_path: Path):
    """train.overrides trains variants of one dataset at different rates: the table says which; where every
    variant has the same rate (or metrics files from before the rate was recorded), no column."""
    root = tmp_path / "project"
    for seed in (0, 1):
        _write_run(root, "swimmer", "psrnn", seed, "continuous", [0.01, 0.005], extra={"lr": 0.1})
        _write_run(root, "swimmer", "kf", seed, "continuous", [0.001, 0.0004], extra={"lr": 0.1 if seed else 0.3})
        _write_run(root, "swimmer", "lstm", seed, "continuous", [1.0, 0.02], extra={"lr": 1.0})
        _write_run(root, "hmm", "psrnn", seed, "discrete", [2.0, 1.9], extra={"lr": 1.0})
        _write_run(root, "hmm", "lstm", seed, "discrete", [2.5, 1.9])
        _write_run(root, "hmm", "gru", seed, "discrete", [2.5, 1.9], extra={"lr": 1.0} if seed else {})
    write_report(root, tmp_path / "reports")
    md = (tmp_path / "reports" / "results.md").read_text()
    assert _table_rows(md, "swimmer") == [
        ["`kf`", "2", "1,000", "0.1 / 0.3", "4.000e-04 ± 0.000e+00", "1.000e-03"],
        ["`psrnn`", "2", "1,000", "0.1", "5.000e-03 ± 0.000e+00", "0.010"],
        ["`lstm`", "2", "1,000", "1", "0.020 ± 0.000", "1.000"]]
    assert "| variant | seeds | params | lr | test MSE |" in md
    assert len(_table_rows(md, "hmm")[0]) == 7   # variant, seeds, params, BPC, accuracy and their init: no lr
    # summary.json holds the rate of each row, for psrnn compare: null where its seeds differ, absent where no
    # metrics file names it
    summary = json.loads((tmp_path / "reports" / "summary.json").read_text())
    assert {v: summary["swimmer"][v]["lr"] for v in ("kf", "psrnn", "lstm")} == {"kf": None, "psrnn": 0.1, "lstm": 1.0}
    assert summary["hmm"]["psrnn"]["lr"] == 1.0 and "lr" not in summary["hmm"]["lstm"]
    assert summary["hmm"]["gru"]["lr"] is None   # one seed's file does not say: not known to be the other's rate


def test_a_spread_that_rounds_to_zero_is_not_shown_as_zero():
    """The std takes the mean's notation, but a non-zero one that rounds to 0.000 there is shown in two digits of
    its own: "± 0.000" reads as seeds that agree exactly (handwriting's lstm_delta, 0.0150 and 0.0152)."""
    from pipeline.report import _mean_std

    assert _mean_std([0.0150, 0.0152]) == "0.015 ± 1.4e-04"
    assert _mean_std([0.020, 0.020]) == "0.020 ± 0.000"            # equal: zero, as it is
    assert _mean_std([0.505, 0.515]) == "0.510 ± 0.007"
    assert _mean_std([4e-4, 5e-4]) == "4.500e-04 ± 7.071e-05"      # small means keep their notation
    assert _mean_std([0.0150, float("nan"), 0.0152]) == "0.015 ± 1.4e-04 (2/3 finite)"
    with np.errstate(over="ignore"):
        assert _mean_std([1e160, 1.0]) == "5.000e+159 ± n/a"   # a std that overflows is not a crash


def test_a_ptb_figure_moved_to_another_dataset_is_titled_by_it():
    from pipeline.report import DEFAULT_FIGURES, _merge_config

    cfg = _merge_config({"fig3a": {"dataset": "hmm"}, "fig3b": {"dataset": "hmm", "title": "mine"}})
    assert cfg["fig3a"]["title"] == DEFAULT_FIGURES["fig3a"]["title"].replace("PTB", "hmm")
    assert cfg["fig3b"]["title"] == "mine" and cfg["fig3c"]["title"] == DEFAULT_FIGURES["fig3c"]["title"]


def test_panel_axis_names_the_symbols_and_reference_values_sit_clear_of_the_curves(project: Path):
    """hmm's axis read 'bits per character' (its symbols are HMM outputs; a custom file's are events), and the
    Bayes optimum's value was written above its line, under the curves that approach it from above: the values are
    written beside the panel, outside its right edge, at their lines' heights."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.report import _plot_panel, axis_label

    runs = collect_runs(project)

    def panel(dataset, metric, **kw):
        by_variant = {}
        for r in runs:
            if r["dataset"] == dataset and r["history"]:
                by_variant.setdefault(r["variant"], []).append(r)
        fig, ax = plt.subplots()
        _plot_panel(ax, by_variant, sorted(by_variant), metric, split="test", show_train=False,
                    values_in_legend=False, dataset=dataset, **kw)
        lo, hi = ax.get_ylim()
        texts = {t.get_text(): (t.get_ha(), t.xy[0], lo + t.xy[1] * (hi - lo)) for t in ax.texts}   # linear axes
        label = ax.get_ylabel()
        plt.close(fig)
        return label, texts

    label, texts = panel("hmm", "bpc", optimal=0.8)
    assert label == "test bits per symbol"
    assert texts["0.8"] == ("left", 1.0, pytest.approx(0.8))   # beside the panel at the line, clear of the curves
    label, texts = panel("ptb", "bpc", optimal=5.0)
    assert label == "test bits per character"
    assert texts["5"] == ("left", 1.0, pytest.approx(5.0))
    assert panel("ptb", "accuracy", optimal=None)[0] == "test one-step prediction accuracy"
    assert axis_label("bpc") == "bits per character" and axis_label("mse", "custom_x") == "mean squared error"


def test_a_seeds_non_finite_metric_is_null_in_the_summary(tmp_path: Path):
    """JSON has no NaN: a diverged seed's per-seed value is null (the mean is that of the finite seeds)."""
    root = tmp_path / "project"
    _write_run(root, "swimmer", "psrnn", 0, "continuous", [0.01, 0.005])
    _write_run(root, "swimmer", "psrnn", 1, "continuous", [0.01, float("nan")])
    write_report(root, tmp_path / "reports")
    text = (tmp_path / "reports" / "summary.json").read_text()
    row = json.loads(text)["swimmer"]["psrnn"]
    assert "NaN" not in text and row["test_mse@s1"] is None and row["test_mse@s0"] == 0.005
    assert row["init_test_mse@s1"] == 0.01 and row["test_mse"] == 0.005 and row["test_mse_finite"] == 1
