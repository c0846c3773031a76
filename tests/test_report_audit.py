"""The report's figures and table on the inputs that a full run does not produce by default: seeds that stopped at
different epochs, a split the histories lack, a listed dataset without runs, user-named features, figures turned
off, and one colour per variant across the figures of a dataset."""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pipeline.report as report
from pipeline.report import write_report
from test_report import _write_predictions, _write_run

PTB_RANKS = ["factorized_psrnn_r10", "factorized_psrnn_r20", "factorized_psrnn_r40", "factorized_psrnn_r60"]


def _lines(ax) -> dict[str, object]:
    return {line.get_label(): line for line in ax.get_lines()}


def test_a_seed_that_stopped_early_does_not_silently_change_the_mean(tmp_path, figures):
    """Seed 1 stopped after epoch 1 (train.patience), seed 0 trained to epoch 3: a mean labelled "2 seeds" that
    is seed 0 alone from epoch 2 on would read as a change of the model. The mean is solid where every seed
    contributes, dotted where fewer do, and results.md says which seed ends where."""
    root = tmp_path / "project"
    _write_run(root, "hmm", "psrnn", 0, "discrete", [4.0, 3.0, 2.0, 1.0])
    _write_run(root, "hmm", "psrnn", 1, "discrete", [4.2, 3.2],
               extra={"stopped_early": "valid bpc did not improve for 1 epochs"})
    write_report(root, tmp_path / "reports", figures={"fig3a": {"dataset": "hmm", "variants": ["psrnn"]}})
    for name, label in (("hmm_curves.png", "psrnn (2 seeds)"), ("fig3a.png", "psrnn (2 seeds, 1,000 params)")):
        ax = figures[name].axes[0]
        lines = _lines(ax)
        solid = lines[label]
        y = np.asarray(solid.get_ydata(), dtype=float)
        assert np.isfinite(y).tolist() == [True, True, False, False], name
        assert y[:2] == pytest.approx([4.1, 3.1])
        dotted = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":" and ln.get_color() == solid.get_color()]
        assert len(dotted) == 1
        x, y = np.asarray(dotted[0].get_xdata()), np.asarray(dotted[0].get_ydata(), dtype=float)
        assert list(x[np.isfinite(y)]) == [1, 2, 3]          # from the last epoch of both seeds on
        assert list(y[np.isfinite(y)]) == pytest.approx([3.1, 2.0, 1.0])
    md = (tmp_path / "reports" / "results.md").read_text()
    assert ("- `hmm_curves.png`: `psrnn` seed 1 ends at epoch 1 (seed 0 at 3); the curve is dotted where it is "
            "the mean of fewer seeds") in md


def test_seeds_of_equal_length_draw_one_solid_mean(tmp_path, figures):
    root = tmp_path / "project"
    for seed in (0, 1):
        _write_run(root, "hmm", "psrnn", seed, "discrete", [4.0 + seed, 3.0, 2.0])
    write_report(root, tmp_path / "reports")
    ax = figures["hmm_curves.png"].axes[0]
    assert [ln.get_linestyle() for ln in ax.get_lines()] == ["-"]
    assert list(ax.get_lines()[0].get_ydata()) == pytest.approx([4.5, 3.0, 2.0])
    assert "dotted" not in (tmp_path / "reports" / "results.md").read_text()


def test_a_split_the_histories_lack_is_noted_not_drawn_empty(tmp_path):
    """Swimmer has no validation split: `split: valid` drew empty axes into fig4a and swimmer_curves.png and
    said nothing."""
    root = tmp_path / "project"
    for v in ("kf", "psrnn"):
        _write_run(root, "swimmer", v, 0, "continuous", [1.0, 0.5])   # train_mse and test_mse only
    _write_run(root, "hmm", "psrnn", 0, "discrete", [2.0, 1.5])
    result = write_report(root, tmp_path / "reports",
                          figures={"fig4a": {"split": "valid"}, "per_dataset": {"split": "valid"}})
    assert {"figures/fig4a.png", "figures/swimmer_curves.png", "figures/hmm_curves.png"} <= set(result["skipped"])
    na = (tmp_path / "reports" / "results.md").read_text().split("## Not available")[1]
    assert "- `swimmer_curves.png`: no `valid` mse in the training histories of `swimmer`" in na
    assert "- `fig4a.png`: no `valid` mse in the training histories of `swimmer`" in na
    # where some variants have the split and others not, the figure is drawn and names the ones left out
    hist = root / "plots" / "swimmer" / "kf" / "s0.json"
    rows = json.loads(hist.read_text())
    hist.write_text(json.dumps([{**r, "valid_mse": r["test_mse"]} for r in rows]))
    result = write_report(root, tmp_path / "reports", figures={"per_dataset": {"split": "valid"}})
    assert "figures/swimmer_curves.png" in result["written"]
    na = (tmp_path / "reports" / "results.md").read_text().split("## Not available")[1]
    assert "- `swimmer_curves.png`: drawn without `psrnn` (no `valid` mse in its training history)" in na


def test_a_listed_dataset_without_runs_is_in_the_results(tmp_path):
    root = tmp_path / "project"
    _write_run(root, "hmm", "psrnn", 0, "discrete", [2.0, 1.5])
    write_report(root, tmp_path / "reports", datasets=["hmm", "custom_plant"])
    md = (tmp_path / "reports" / "results.md").read_text()
    assert "## custom_plant\n\nNo final metrics (`metrics/custom_plant/*.json`) for this dataset." in md
    assert "No runs found." not in md
    assert set(json.loads((tmp_path / "reports" / "summary.json").read_text())) == {"hmm"}


@pytest.mark.parametrize("feature", ["a$^$b", "price ($) per $ unit"])
def test_dollar_signs_in_a_feature_name_are_text(tmp_path, figures, feature):
    """A custom dataset's column names are the user's: two dollar signs made matplotlib parse the name as math
    (a garbled label, or a ValueError that stopped the report stage)."""
    from matplotlib import cbook

    root = tmp_path / "project"
    _write_run(root, "custom", "psrnn", 0, "continuous", [1.0, 0.5])
    table = pa.table({"trajectory": pa.array([0] * 5, pa.int64()), "step": pa.array(range(1, 6), pa.int64()),
                      "feature": pa.array([feature] * 5, pa.string()), "target": pa.array([0.1] * 5),
                      "initial": pa.array([0.2] * 5), "final": pa.array([0.1] * 5)})
    (root / "predictions" / "custom").mkdir(parents=True)
    pq.write_table(table, root / "predictions" / "custom" / "psrnn_s0.parquet")
    result = write_report(root, tmp_path / "reports", figures={"fig4b": {"dataset": "custom", "variants": ["psrnn"]}})
    assert "figures/fig4b.png" in result["written"]
    fig = figures["fig4b.png"]
    for text in (fig.axes[0].yaxis.label, fig._suptitle):
        assert not cbook.is_math_text(text.get_text())
        assert text._preprocess_math(text.get_text())[0].count(feature) == 1


def test_a_variant_has_one_colour_in_every_figure_of_a_dataset(tmp_path, figures):
    """fig3a drew the rank-60 model in the middle of viridis, next to the LSTM's blue, and in another colour than
    fig3c and ptb_curves.png: a variant's colour depends on the dataset's variants, not on the figure's."""
    from matplotlib.colors import to_rgb

    root = tmp_path / "project"
    for v in ["lstm", "gru", "psrnn"] + PTB_RANKS:
        _write_run(root, "ptb", v, 0, "discrete", [4.0, 3.0])
    write_report(root, tmp_path / "reports")
    colour = {}
    for name in ("fig3a.png", "fig3c.png", "ptb_curves.png"):
        for label, line in _lines(figures[name].axes[0]).items():
            v = label.split(" (")[0]
            colour.setdefault(v, set()).add(to_rgb(line.get_color()))
    assert all(len(c) == 1 for c in colour.values()), colour
    r60, lstm = np.array(next(iter(colour["factorized_psrnn_r60"]))), np.array(next(iter(colour["lstm"])))
    assert np.abs(r60 - lstm).max() > 0.3


def test_a_figure_turned_off_leaves_no_stale_png(tmp_path):
    root = tmp_path / "project"
    _write_run(root, "ptb", "lstm", 0, "discrete", [4.0, 3.0])
    out = tmp_path / "reports"
    assert "figures/fig3a.png" in write_report(root, out)["written"]
    write_report(root, out, figures={"fig3a": False})
    assert not (out / "figures" / "fig3a.png").exists()


def test_the_bayes_optimal_line_is_drawn_on_the_test_split_only(tmp_path, figures):
    """The synthetic sets' Bayes-optimal value is the true filter's on the test split (data.synthetic): on a train
    or valid panel the line was drawn under the same label, where a model can go below it."""
    root = tmp_path / "project"
    _write_run(root, "hmm", "psrnn", 0, "discrete", [2.0, 1.5], bayes={"bpc": 1.6})
    write_report(root, tmp_path / "train", figures={"per_dataset": {"split": "train"}})
    assert not [k for k in _lines(figures["hmm_curves.png"].axes[0]) if k.startswith("Bayes optimal")]
    write_report(root, tmp_path / "test")
    # the BPC and accuracy panels share one legend, so the line's value is written on it
    bpc = figures["hmm_curves.png"].axes[0]
    assert "Bayes optimal" in _lines(bpc) and "1.6" in [t.get_text() for t in bpc.texts]
    legend = [t.get_text() for t in figures["hmm_curves.png"].axes[-1].get_legend().get_texts()]
    assert legend == ["psrnn (1 seed)", "Bayes optimal"]   # drawn on the BPC panel, listed beside the last


def test_a_dataset_with_a_bayes_optimum_gets_a_panel_of_the_gap_to_it(tmp_path, figures):
    """lgssm's 2SR models end within 5% of the optimum, under an RNN that starts at 2.7 times it: on the MSE axis
    their curves were one line. A second panel draws each variant's gap to the optimum on a log axis: the mean
    over seeds minus the optimum, a gap within GAP_FLOOR of it (or below it: a finite test sample) on the floor,
    the naive predictors' gaps beside them; not on a split without the optimum."""
    root = tmp_path / "project"
    _write_run(root, "lgssm", "psrnn", 0, "continuous", [0.30, 0.25, 0.21], bayes={"mse": 0.2})
    _write_run(root, "lgssm", "psrnn", 1, "continuous", [0.30, 0.23, 0.23], bayes={"mse": 0.2})
    _write_run(root, "lgssm", "kf", 0, "continuous", [0.2001, 0.19999], bayes={"mse": 0.2},
               extra={"naive": {"last_value": {"mse": 0.5}}})
    write_report(root, tmp_path / "reports")
    fig = figures["lgssm_curves.png"]
    assert len(fig.axes) == 2
    mse, gap = fig.axes
    assert gap.get_yscale() == "log" and gap.get_ylabel() == ("test MSE above the Bayes optimum\n(log scale; dashed: "
                                                              "within 0.1%)")
    lines = _lines(gap)
    assert np.asarray(lines["psrnn (2 seeds)"].get_ydata(), dtype=float) == pytest.approx([0.10, 0.04, 0.02])
    # kf: 0.0001 above and 0.00001 below the optimum, both within 0.1% of it: on the floor, 0.0002
    assert np.asarray(lines["kf (1 seed)"].get_ydata(), dtype=float) == pytest.approx([2e-4, 2e-4])
    assert lines["Bayes optimal"].get_ydata()[0] == pytest.approx(2e-4)
    assert lines["last value"].get_ydata()[0] == pytest.approx(0.3)
    # the floor and the values written on the lines have room: half the floor, twice the highest line
    assert gap.get_ylim() == pytest.approx((1e-4, 0.6))
    assert [t.get_text() for t in gap.texts] == ["≤ 0.0002", "0.3"]
    assert set(_lines(mse)) == set(lines)   # the same entries, one legend beside the last panel
    assert len(mse.get_legend_handles_labels()[0]) == len(gap.get_legend_handles_labels()[0])
    # a discrete set: BPC, its gap, then accuracy
    _write_run(root, "hmm", "psrnn", 0, "discrete", [2.0, 1.7], bayes={"bpc": 1.6})
    write_report(root, tmp_path / "reports")
    assert [ax.get_ylabel() for ax in figures["hmm_curves.png"].axes] == [
        "test bits per symbol", "test BPC above the Bayes optimum\n(log scale; dashed: within 0.1%)",
        "test one-step prediction accuracy"]
    assert np.asarray(_lines(figures["hmm_curves.png"].axes[1])["psrnn (1 seed)"].get_ydata(),
                      dtype=float) == pytest.approx([0.4, 0.1])
    # the training split has no optimum: no gap panel
    write_report(root, tmp_path / "train", figures={"per_dataset": {"split": "train"}})
    assert len(figures["lgssm_curves.png"].axes) == 1 and len(figures["hmm_curves.png"].axes) == 2


def test_a_seed_that_turned_non_finite_is_counted_not_hidden(tmp_path, figures):
    """Seed 1 trained to epoch 2 but its last value is NaN: summary.json says one finite seed of two (its mean of
    one value read as a row of one seed), the gap column counts it as the test column does, and the note does
    not call it an early stop."""
    root = tmp_path / "project"
    bayes = {"bpc": 0.5}
    _write_run(root, "hmm", "psrnn", 0, "discrete", [4.0, 3.0, 2.0], bayes=bayes)
    _write_run(root, "hmm", "psrnn", 1, "discrete", [4.2, 3.2, float("nan")], bayes=bayes)
    write_report(root, tmp_path / "reports")
    row = json.loads((tmp_path / "reports" / "summary.json").read_text())["hmm"]["psrnn"]
    assert row["seeds"] == 2 and row["test_bpc_finite"] == 1 and row["test_bpc"] == 2.0
    assert row["test_bpc_std"] is None and "test_accuracy_finite" not in row
    md = (tmp_path / "reports" / "results.md").read_text()
    table_row = next(line for line in md.splitlines() if line.startswith("| `psrnn`"))
    assert table_row.count("(1/2 finite)") == 2      # the test BPC and its gap to the optimum
    assert ("`psrnn` seed 1 diverged (no finite value after epoch 1; trained to 2) (seed 0 at 2)") in md


def test_a_title_with_dollar_signs_is_drawn_as_text(tmp_path, figures):
    r"""Titles are params.yaml text: "$\foo$" had matplotlib parse math and stop the report (after some figures
    were written), "$x$" lost its dollar signs."""
    root = tmp_path / "project"
    for seed in (0, 1):
        _write_run(root, "hmm", "psrnn", seed, "discrete", [4.0 + seed, 3.0, 2.0])
    title = r"Fig 3a: $\foo$ costs $5"
    write_report(root, tmp_path / "reports", figures={"fig3a": {"dataset": "hmm", "variants": ["psrnn"],
                                                                "title": title}})
    fig = figures["fig3a.png"]
    assert fig._suptitle.get_text() == title.replace("$", r"\$")


def test_a_report_that_fails_halfway_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    """A figure that cannot be drawn stops the report: the earlier report's figures, table and summary stay as
    they were (fig3a-c had been rewritten, fig4a and results.md not: two reports mixed)."""
    root = tmp_path / "project"
    for seed in (0, 1):
        _write_run(root, "hmm", "psrnn", seed, "discrete", [4.0 + seed, 3.0, 2.0])
    out = tmp_path / "reports"
    figures = {"fig3a": {"dataset": "hmm", "variants": ["psrnn"]}}
    write_report(root, out, figures=figures)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert Path("figures/fig3a.png") in before and Path("figures/hmm_curves.png") in before
    _write_run(root, "hmm", "psrnn", 1, "discrete", [5.0, 4.0, 3.0])   # a new report would differ

    def broken(*args, **kwargs):
        raise RuntimeError("cannot draw")

    monkeypatch.setattr(report, "_per_dataset", broken)   # drawn after fig3a
    with pytest.raises(RuntimeError, match="cannot draw"):
        write_report(root, out, figures=figures)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not (out / ".figures.partial").exists()


def _custom_predictions(root, variant: str) -> None:
    """A custom file's predictions as evaluate writes them: test trajectory 0 is the user's 'run-04', its steps
    0, 10, ..., 620 (rows 1..62 predicted)."""
    steps = np.arange(1, 63)
    table = pa.table({"trajectory": pa.array([0] * 62, pa.int64()), "step": pa.array(steps, pa.int64()),
                      "feature": pa.array(["position"] * 62, pa.string()), "target": pa.array(np.sin(steps / 9)),
                      "initial": pa.array(np.sin(steps / 9) + 0.2), "final": pa.array(np.sin(steps / 9) + 0.01),
                      "trajectory_id": pa.array(["run-04"] * 62), "source_step": pa.array(10 * steps, pa.int64())})
    (root / "predictions" / "custom").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, root / "predictions" / "custom" / f"{variant}_s0.parquet")


def test_fig4b_on_a_custom_dataset_draws_its_own_variants_at_its_own_steps(tmp_path, figures):
    """`fig4b: {dataset: custom}` drew the paper's kf, rnn, gru, lstm, psrnn: it left out the user's psrnn_delta
    and listed "no prediction file" for rnn, gru and lstm, which the dataset never trains; its x axis ran over the
    renumbered rows 1..62 and its title said trajectory 0 rather than the user's steps 10..620 and id run-04."""
    root = tmp_path / "project"
    for v in ("psrnn", "psrnn_delta", "kf"):
        _write_run(root, "custom", v, 0, "continuous", [1.0, 0.5])
        _custom_predictions(root, v)
    result = write_report(root, tmp_path / "reports", figures={"fig4b": {"dataset": "custom", "feature": "position"}})
    assert "figures/fig4b.png" in result["written"]
    fig = figures["fig4b.png"]
    assert [ax.get_title() for ax in fig.axes[:3]] == ["kf (seed 0)", "psrnn (seed 0)", "psrnn_delta (seed 0)"]
    x = fig.axes[0].get_lines()[0].get_xdata()
    assert list(x) == list(range(10, 630, 10))
    assert fig._suptitle.get_text().endswith("\ncustom, feature position, trajectory run-04")
    md = (tmp_path / "reports" / "results.md").read_text()
    assert "fig4b" not in md.split("## Not available")[1]
    # variants named: those alone, and a missing one is noted (it was asked for)
    write_report(root, tmp_path / "reports", figures={"fig4b": {"dataset": "custom", "variants": ["kf", "lstm"]}})
    assert [ax.get_title() for ax in figures["fig4b.png"].axes] == ["kf (seed 0)", ""]
    md = (tmp_path / "reports" / "results.md").read_text()
    assert "- `fig4b.png`: no prediction file for `lstm` on `custom`" in md


def test_fig4b_picks_a_custom_trajectory_by_the_users_id(tmp_path, figures):
    """`report.figures.fig4b.trajectory` is a test trajectory's number from 0, or the user's own id (a string):
    `run-07` draws the trajectory the file calls so; an id the test split lacks is a note naming those it has."""
    root = tmp_path / "project"
    steps = np.arange(1, 11)
    rows = {"trajectory": [], "step": [], "target": [], "trajectory_id": [], "source_step": []}
    for k, name in enumerate(("run-04", "run-07")):
        rows["trajectory"] += [k] * 10
        rows["step"] += steps.tolist()
        rows["target"] += (np.sin(steps / 3) + k).tolist()
        rows["trajectory_id"] += [name] * 10
        rows["source_step"] += (100 * k + 5 * steps).tolist()
    target = np.asarray(rows["target"])
    table = pa.table({"trajectory": pa.array(rows["trajectory"], pa.int64()), "step": pa.array(rows["step"], pa.int64()),
                      "feature": pa.array(["position"] * 20, pa.string()), "target": pa.array(target),
                      "initial": pa.array(target + 0.2), "final": pa.array(target + 0.01),
                      "trajectory_id": pa.array(rows["trajectory_id"]),
                      "source_step": pa.array(rows["source_step"], pa.int64())})
    _write_run(root, "custom", "psrnn", 0, "continuous", [1.0, 0.5])
    (root / "predictions" / "custom").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, root / "predictions" / "custom" / "psrnn_s0.parquet")
    write_report(root, tmp_path / "reports", figures={"fig4b": {"dataset": "custom", "trajectory": "run-07"}})
    fig = figures["fig4b.png"]
    assert fig._suptitle.get_text().endswith("\ncustom, feature position, trajectory run-07")
    assert list(fig.axes[0].get_lines()[0].get_xdata()) == list(range(105, 151, 5))
    result = write_report(root, tmp_path / "reports", figures={"fig4b": {"dataset": "custom", "trajectory": "run-9"}})
    assert "figures/fig4b.png" not in result["written"]
    md = (tmp_path / "reports" / "results.md").read_text()
    assert ("- `fig4b.png`: trajectory id `run-9` is not among the test trajectories' ids on `custom` (`run-04`, "
            "`run-07`); `report.figures.fig4b.trajectory` names one of them, or a number from 0") in md


def test_fig4b_on_a_paper_dataset_keeps_the_papers_variants(tmp_path, figures):
    """On the paper's datasets fig4b is the paper's figure: its models, in its order, whatever else was trained;
    a file without the custom columns (Swimmer's) keeps the prepared steps and numbers its trajectory."""
    root = tmp_path / "project"
    rng = np.random.default_rng(0)
    for v in ("psrnn_delta", "lstm", "kf"):
        _write_run(root, "swimmer", v, 0, "continuous", [1.0, 0.5])
        _write_predictions(root, "swimmer", f"{v}_s0", rng)
    write_report(root, tmp_path / "reports", figures={"fig4b": {}})
    fig = figures["fig4b.png"]
    assert [ax.get_title() for ax in fig.axes[:2]] == ["kf (seed 0)", "lstm (seed 0)"]
    assert list(fig.axes[0].get_lines()[0].get_xdata()) == list(range(1, 40))
    assert fig._suptitle.get_text().endswith("trajectory 3")
    md = (tmp_path / "reports" / "results.md").read_text()
    for v in ("rnn", "gru", "psrnn"):
        assert f"- `fig4b.png`: no prediction file for `{v}` on `swimmer`" in md


def test_the_mse_in_data_units_is_in_the_table_and_summary_of_the_datasets_that_have_it(tmp_path):
    """evaluate's mse_data_units (standardised data) is a column of results.md and test_mse_data_units (mean and
    std over seeds) a key of summary.json, beside the standardised MSE; a dataset without it has neither."""
    root = tmp_path / "project"
    naive = {"last_value": {"mse": 0.25}, "train_mean": {"mse": 1.0}}
    for seed, units in ((0, 2.0), (1, 4.0)):
        _write_run(root, "custom", "kf", seed, "continuous", [1.0, 0.5],
                   extra={"test": {"mse": 0.5, "mse_data_units": units}, "naive": naive})
    _write_run(root, "lgssm", "kf", 0, "continuous", [1.0, 0.25], extra={"naive": naive})
    write_report(root, tmp_path / "reports")
    summary = json.loads((tmp_path / "reports" / "summary.json").read_text())
    assert summary["custom"]["kf"]["test_mse_data_units"] == 3.0
    assert summary["custom"]["kf"]["test_mse_data_units_std"] == pytest.approx(np.sqrt(2.0))
    assert not any("data_units" in k for k in summary["lgssm"]["kf"])
    md = (tmp_path / "reports" / "results.md").read_text()
    custom, lgssm = md.split("## custom")[1].split("## lgssm")
    # the model's column says its units where the data's are beside it, and so does the naive predictors' line
    assert "| variant | seeds | params | test MSE (standardised) | test MSE (data units) | init MSE (mean) |" in custom
    assert "| `kf` | 2 | 1,000 | 0.500 ± 0.000 | 3.000 ± 1.414 |" in custom
    assert "Naive predictors (no state beyond the last observation), test MSE (standardised): last value 0.250, " \
           "training mean 1.000" in custom
    assert "data units" not in lgssm and "standardised" not in lgssm
    assert "| variant | seeds | params | test MSE | init MSE (mean) |" in lgssm
    assert ("Naive predictors (no state beyond the last observation), test MSE: last value 0.250, training mean "
            "1.000") in lgssm
    # a model worse than a naive predictor is named under its table (0.5 against the last value's 0.25); one that
    # is not (lgssm's 0.25: no worse) is not
    assert "Worse on test than the last value predictor (MSE 0.250, mean over seeds): `kf`." in custom
    assert "Worse on test" not in lgssm


def test_2sr_variants_that_ended_worse_than_their_start_are_named_under_the_table(tmp_path):
    """Swimmer's PSRNN at lr 1 went from 0.006 to 0.69 test MSE with nothing in results.md but the init column: the
    2SR-initialised variants (PSRNNs, factorized, KF) whose mean test metric ended more than 10% worse than their
    mean start are named under their table; Xavier baselines, which start from no model, and variants that held
    are not."""
    root = tmp_path / "project"
    for seed, (start, end) in enumerate(((0.006, 0.69), (0.0066, 0.70))):
        _write_run(root, "swimmer", "psrnn", seed, "continuous", [start, 0.3, end])
    _write_run(root, "swimmer", "kf", 0, "continuous", [0.0009, 0.00098])          # 9% worse: not more than 10%
    _write_run(root, "swimmer", "factorized_psrnn_r40", 0, "continuous", [0.006, 0.0095])
    _write_run(root, "swimmer", "lstm", 0, "continuous", [1.2, 0.02])               # Xavier: improved, not named
    _write_run(root, "swimmer", "gru", 0, "continuous", [0.01, 0.5])                # Xavier: not compared
    write_report(root, tmp_path / "reports")
    md = (tmp_path / "reports" / "results.md").read_text()
    assert ("Ended more than 10% worse than their initialisation on test (mean over seeds, test MSE): "
            "`factorized_psrnn_r40` 6.000e-03 → 9.500e-03; `psrnn` 6.300e-03 → 0.695: BPTT undid the 2SR start (a "
            "lower rate for them, `train.overrides`, or `train.restore_best` keeps it: README, \"Per-variant "
            "training settings\").") in md, md
    _write_run(root, "swimmer", "psrnn", 0, "continuous", [0.006, 0.005])
    _write_run(root, "swimmer", "psrnn", 1, "continuous", [0.0066, 0.006])
    _write_run(root, "swimmer", "factorized_psrnn_r40", 0, "continuous", [0.006, 0.006])
    write_report(root, tmp_path / "reports")
    assert "Ended more than" not in (tmp_path / "reports" / "results.md").read_text()


def test_fig4a_has_one_legend_beside_its_panels_and_fig4b_orders_a_custom_sets_models_as_the_paper(tmp_path,
                                                                                                     figures):
    """fig4a repeated its legend inside every panel, over the curves and the naive lines; a custom fig4b drew its
    columns alphabetically (gru, kf, lstm, ...) rather than in the paper's kf, rnn, gru, lstm, psrnn order, with a
    legend in the first model's colour; an MSE axis did not say it is in standardised units."""
    root = tmp_path / "project"
    rng = np.random.default_rng(0)
    for ds in ("swimmer", "mocap"):
        for i, v in enumerate(("kf", "rnn", "gru", "lstm", "psrnn")):
            _write_run(root, ds, v, 0, "continuous", [3.0 - i * 0.1, 1.0])
            _write_predictions(root, ds, f"{v}_s0", rng)
    for v in ("psrnn_delta", "lstm", "gru", "kf"):   # standardised features: evaluate adds the data-units MSE
        _write_run(root, "custom", v, 0, "continuous", [1.0, 0.5], extra={"test": {"mse": 0.5, "mse_data_units": 2.0}})
        _custom_predictions(root, v)
    write_report(root, tmp_path / "reports", figures={"fig4b": {"dataset": "custom", "feature": "position"}})
    assert figures["custom_curves.png"].axes[0].get_ylabel() == "test mean squared error\n(standardised units)"
    assert figures["swimmer_curves.png"].axes[0].get_ylabel() == "test mean squared error"
    fig = figures["fig4a.png"]
    assert [ax.get_legend() is not None for ax in fig.axes] == [False, True]
    assert [t.get_text() for t in fig.axes[-1].get_legend().get_texts()][:5] == [
        f"{v} (1 seed)" for v in ("kf", "rnn", "gru", "lstm", "psrnn")]
    # one y label for panels that share it: each repeated it, into the previous panel's right edge
    assert [ax.get_ylabel() for ax in fig.axes] == ["test mean squared error", ""]
    assert [ax.get_title() for ax in figures["fig4b.png"].axes[:4]] == [
        "kf (seed 0)", "gru (seed 0)", "lstm (seed 0)", "psrnn_delta (seed 0)"]
    assert [t.get_text() for t in figures["fig4b.png"].legends[0].get_texts()] == [
        "test data", "one-step prediction (the model's colour)"]
    # panels in other units keep their own labels
    write_report(root, tmp_path / "reports", figures={"fig4a": {"datasets": ["swimmer", "custom"]}})
    assert [ax.get_ylabel() for ax in figures["fig4a.png"].axes] == [
        "test mean squared error", "test mean squared error\n(standardised units)"]


def test_a_negative_gap_to_the_bayes_optimum_is_explained(tmp_path):
    """lgssm's KF scored its test set 6e-6 below the true filter: an unexplained negative gap reads like a bug."""
    root = tmp_path / "project"
    _write_run(root, "lgssm", "kf", 0, "continuous", [0.3, 0.19999], bayes={"mse": 0.2})
    _write_run(root, "lgssm", "psrnn", 0, "continuous", [0.3, 0.21], bayes={"mse": 0.2})
    write_report(root, tmp_path / "reports")
    md = (tmp_path / "reports" / "results.md").read_text()
    assert ("A negative gap (`kf`): the Bayes-optimal value is the true filter's on this test set, and a model may "
            "score a finite test set a little better by chance (sampling noise, not a better filter).") in md
    assert "`psrnn`" not in md.split("A negative gap")[1].split("\n")[0]
    _write_run(root, "lgssm", "kf", 0, "continuous", [0.3, 0.1], bayes={"mse": 0.2})   # 50% below: no chance
    write_report(root, tmp_path / "reports")
    md = (tmp_path / "reports" / "results.md").read_text()
    assert "A gap more than 1% below the optimum (`kf`): no filter beats the true one by that much" in md
    assert "A negative gap" not in md


def test_fig4b_says_each_runs_test_mse_and_the_units_and_draws_the_data_on_top(tmp_path, figures):
    """Swimmer's PSRNN column showed seed 0 (test MSE 0.032) beside a table mean of 0.85 (seed 1: 1.66), with
    nothing to tell: each panel writes its run's test MSE before and after training; the y axis says the units
    are standardised, and the test data are drawn over the prediction (the KF's hid them)."""
    root = tmp_path / "project"
    rng = np.random.default_rng(0)
    for v, (start, end) in (("kf", (0.0009, 0.0006)), ("psrnn", (0.0063, 0.032))):
        _write_run(root, "swimmer", v, 0, "continuous", [start, end],
                   extra={"test": {"mse": end, "mse_data_units": 3 * end},
                          "initial_test": {"mse": start, "mse_data_units": 3 * start}})
        _write_predictions(root, "swimmer", f"{v}_s0", rng)
    write_report(root, tmp_path / "reports", figures={"fig4b": {"variants": ["kf", "psrnn"]}})
    fig = figures["fig4b.png"]
    axes = fig.axes[:4]   # rows: before, after; columns: kf, psrnn
    texts = [[t.get_text() for t in ax.texts] for ax in axes]
    # the whole test set's MSE over every feature, of the seed drawn: not the trajectory's, not the feature's
    assert texts == [[f"test-set MSE (all features): {x}"] for x in ("0.0009", "0.0063", "0.0006", "0.032")]
    for ax in axes:   # the text stands in headroom above every point drawn, not over the curves
        ys = np.concatenate([ln.get_ydata() for ln in ax.get_lines()])
        low, high = ax.get_ylim()
        assert ys.max() <= high - 0.8 * (high - low) * (1 - 1 / (1 + report.FIG4B_HEADROOM))
    assert axes[0].get_ylabel() == "before training\nqpos_0 (standardised)"
    data, prediction = ([ln for ln in axes[0].get_lines() if ln.get_label() == name][0]
                        for name in ("test data", "one-step prediction"))
    assert data.get_zorder() > prediction.get_zorder()


def test_curves_of_variants_trained_at_other_rates_say_their_rate(tmp_path, figures):
    """The override's figures drew psrnn at lr 0.1 beside baselines at lr 1 with nothing to tell (only the table's
    lr column did): where a figure's variants trained at more than one rate, each legend entry says its own."""
    root = tmp_path / "project"
    for v, lr in (("kf", 0.01), ("psrnn", 0.1), ("lstm", 1.0)):
        for seed in (0, 1):
            _write_run(root, "swimmer", v, seed, "continuous", [1.0, 0.5], extra={"lr": lr})
    _write_run(root, "mocap", "psrnn", 0, "continuous", [1.0, 0.5], extra={"lr": 1.0})
    _write_run(root, "mocap", "lstm", 0, "continuous", [1.0, 0.5], extra={"lr": 1.0})
    write_report(root, tmp_path / "reports", figures={"fig4a": {"datasets": ["swimmer", "mocap"]}})

    def labels(fig):
        return [t.get_text() for ax in fig.axes for lg in [ax.get_legend()] if lg for t in lg.get_texts()]

    assert labels(figures["swimmer_curves.png"])[:3] == ["kf (2 seeds, lr 0.01)", "lstm (2 seeds, lr 1)",
                                                          "psrnn (2 seeds, lr 0.1)"]
    assert labels(figures["mocap_curves.png"])[:2] == ["lstm (1 seed)", "psrnn (1 seed)"]   # one rate: unsaid
    # fig4a: one entry a variant, each panel's rates under its title
    shared = labels(figures["fig4a.png"])
    assert "psrnn (swimmer 2 seeds; mocap 1 seed)" in shared and not [t for t in shared if "lr" in t]


def test_figure_3_legends_say_each_models_parameter_count(tmp_path, figures):
    """The paper's Figure 3 compares models of about equal parameters (3a) or of fewer (3c): each legend entry of
    the PTB figures says its count, as results.md's params column does; the other figures keep theirs short."""
    root = tmp_path / "project"
    for v, n in (("lstm", 5164), ("gru", 4324), ("factorized_psrnn_r60", 5444)):
        for seed in (0, 1):
            _write_run(root, "ptb", v, seed, "discrete", [4.0, 3.0, 2.9], n_params=n)
    write_report(root, tmp_path / "reports", figures={"fig3a": {}})
    texts = [t.get_text() for ax in figures["fig3a.png"].axes for lg in [ax.get_legend()] if lg
             for t in lg.get_texts()]
    assert texts[:3] == ["lstm (2 seeds, 5,164 params)", "gru (2 seeds, 4,324 params)",
                         "factorized_psrnn_r60 (2 seeds, 5,444 params)"]
    curves = [t.get_text() for ax in figures["ptb_curves.png"].axes for lg in [ax.get_legend()] if lg
              for t in lg.get_texts()]
    assert "lstm (2 seeds)" in curves


def test_a_reference_value_at_the_bottom_of_a_panel_is_written_above_its_line(tmp_path, figures):
    """The unigram's accuracy, under every curve, is the lowest line of its panel, drawn on its frame with its value
    written below it, over the epoch ticks (fig3c's "0.1826" over the "10"): the panel now leaves room under a
    line at its edge, and the value is written beside the panel, at the line's height."""
    root = tmp_path / "project"
    naive = {"unigram": {"bpc": 4.3, "accuracy": 0.18}}
    for seed in (0, 1):
        _write_run(root, "hmm", "psrnn", seed, "discrete", [4.0, 3.0, 2.0], accuracy=[0.3, 0.4, 0.45],
                   extra={"naive": naive})
    write_report(root, tmp_path / "reports")
    fig = figures["hmm_curves.png"]
    bpc, accuracy = fig.axes[:2]
    (unigram_accuracy,) = [t for t in accuracy.texts if t.get_text() == "0.18"]
    lo, hi = accuracy.get_ylim()
    assert (0.18 - lo) / (hi - lo) > 0.07                   # the line clear of the frame
    assert unigram_accuracy.xy == pytest.approx((1.0, (0.18 - lo) / (hi - lo)))   # beside it, outside the panel
    assert (unigram_accuracy.get_ha(), unigram_accuracy.get_va()) == ("left", "center")
    (unigram_bpc,) = [t for t in bpc.texts if t.get_text() == "4.3"]
    assert unigram_bpc.get_ha() == "left" and unigram_bpc.xy[0] == 1.0


def test_the_gap_panel_draws_each_variant_in_the_colour_of_the_other_panels(tmp_path, figures):
    """fig3a on hmm drew factorized_psrnn_r5 purple in the BPC and accuracy panels but yellow-green in the gap panel:
    the gap panel took its colours from the variants drawn (one rank: viridis' top), not from the dataset's (two
    ranks: r5 at the bottom)."""
    from matplotlib.colors import to_rgba

    root = tmp_path / "project"
    for v, curve in (("lstm", [2.6, 2.0, 1.9]), ("gru", [2.6, 2.1, 1.95]), ("factorized_psrnn_r5", [2.0, 1.92, 1.89]),
                     ("factorized_psrnn_r10", [2.0, 1.93, 1.86])):
        _write_run(root, "hmm", v, 0, "discrete", curve, bayes={"bpc": 1.8})
    write_report(root, tmp_path / "reports",
                 figures={"fig3a": {"dataset": "hmm", "variants": ["lstm", "gru", "factorized_psrnn_r5"]}})
    for name in ("fig3a.png", "hmm_curves.png"):
        panels = figures[name].axes[:3]   # BPC, its gap to the optimum, accuracy
        colours = [{ln.get_label().split(" (")[0]: to_rgba(ln.get_color()) for ln in ax.get_lines()
                    if not ln.get_label().startswith("_") and "(" in ln.get_label()} for ax in panels]
        assert "factorized_psrnn_r5" in colours[1], name
        for v, c in colours[0].items():
            assert colours[1][v] == c and colours[2][v] == c, (name, v)


def test_model_families_differ_by_marker_and_a_delta_variant_by_its_line_and_open_marker(tmp_path, figures):
    """Every curve was a solid line with the same "o": factorized_psrnn_r20 against the LSTM, r40 against the GRU
    differed by colour alone. Each family has its marker (a _delta variant its model's, open, on a dash-dot line),
    kept on the dotted segment where fewer seeds are averaged, and drawn on a curve of many epochs too."""
    root = tmp_path / "project"
    variants = ["psrnn", "psrnn_delta", "psrnn_2layer", "psrnn_2layer_skip", "factorized_psrnn_r20",
                "factorized_psrnn_r40", "lstm", "gru", "rnn", "kf"]
    for v in variants:
        _write_run(root, "swimmer", v, 0, "continuous", [1.0, 0.5, 0.4, 0.3])
    _write_run(root, "swimmer", "psrnn_delta", 1, "continuous", [1.0, 0.5],
               extra={"stopped_early": "valid mse did not improve for 1 epochs"})
    _write_run(root, "ptb", "lstm", 0, "discrete", list(np.linspace(4.0, 2.0, 41)))
    write_report(root, tmp_path / "reports")
    ax = figures["swimmer_curves.png"].axes[0]
    lines = {ln.get_label().split(" (")[0]: ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    style = {v: (lines[v].get_marker(), lines[v].get_linestyle(), lines[v].get_fillstyle()) for v in variants}
    assert style["factorized_psrnn_r20"][0] == style["factorized_psrnn_r40"][0] == "^"
    for a, b in (("factorized_psrnn_r20", "lstm"), ("factorized_psrnn_r40", "gru"), ("psrnn", "psrnn_2layer"),
                 ("psrnn_2layer", "psrnn_2layer_skip"), ("lstm", "gru"), ("gru", "rnn"), ("rnn", "kf"),
                 ("psrnn", "kf"), ("psrnn", "psrnn_delta")):
        assert style[a] != style[b], (a, b)
    assert style["psrnn"] == ("o", "-", "full") and style["psrnn_delta"] == ("o", "-.", "none")
    (fewer,) = [ln for ln in ax.get_lines() if ln.get_label() == "_psrnn_delta (fewer seeds)"]
    assert (fewer.get_linestyle(), fewer.get_marker(), fewer.get_fillstyle()) == (":", "o", "none")
    long = _lines(figures["ptb_curves.png"].axes[0])["lstm (1 seed)"]
    assert long.get_marker() == "v" and long.get_markevery() == 3   # 41 epochs: about 15 markers


def test_a_legend_counts_a_diverged_seed_as_diverged_not_as_a_seed_of_the_curve(tmp_path, figures):
    """rnn's seed 1 had no finite value after epoch 0 and the legend said "2 seeds" over a curve that was seed 0
    alone from epoch 1 on: a seed whose last trained epoch has no finite value is counted as diverged (results.md's
    note says from when); a seed stopped early by patience, finite at its end, did not diverge."""
    root = tmp_path / "project"
    nan = float("nan")
    _write_run(root, "swimmer", "rnn", 0, "continuous", [3.0, 2.0, 1.0, 0.8])
    _write_run(root, "swimmer", "rnn", 1, "continuous", [3.0, nan, nan, nan])
    _write_run(root, "swimmer", "lstm", 0, "continuous", [3.0, 2.0, 1.0, 0.7])
    _write_run(root, "swimmer", "lstm", 1, "continuous", [3.0, 2.5], extra={"stopped_early": "patience"})
    _write_run(root, "swimmer", "gru", 0, "continuous", [3.0, 2.0, 1.0, 0.7])
    _write_run(root, "swimmer", "gru", 1, "continuous", [3.0, nan, 1.2, 0.75])   # non-finite once, then finite
    write_report(root, tmp_path / "reports")
    for name in ("swimmer_curves.png", "fig4a.png"):
        labels = [t.get_text() for ax in figures[name].axes for lg in [ax.get_legend()] if lg
                  for t in lg.get_texts()]
        assert labels[:3] == ["gru (2 seeds)", "lstm (2 seeds)", "rnn (2 seeds, 1 diverged)"] or \
            labels[:3] == ["rnn (2 seeds, 1 diverged)", "gru (2 seeds)", "lstm (2 seeds)"], (name, labels)
    md = (tmp_path / "reports" / "results.md").read_text()
    assert ("- `swimmer_curves.png`: `rnn` seed 1 diverged (no finite value after epoch 0; trained to 3) (seed 0 "
            "at 3); the curve is dotted where it is the mean of fewer seeds") in md
    assert "- `swimmer_curves.png`: `lstm` seed 1 ends at epoch 1 (seed 0 at 3)" in md


def _keep_train_values(root: Path, dataset: str, variant: str, seed: int, *, until: int | None = None,
                       nan_after: int | None = None) -> None:
    """Rewrite refine's plot file of a run the way its history would read: without ``train_*`` values after epoch
    ``until`` (trained with ``eval_train: true``, resumed with ``false``: fit writes no ``train`` entry; ``until``
    -1: none at all), or with ``train_*`` values NaN after epoch ``nan_after`` (written as JSON ``NaN``, as
    refine's json.dumps writes a NaN metric)."""
    path = root / "plots" / dataset / variant / f"s{seed}.json"
    rows = json.loads(path.read_text())
    for row in rows:
        for key in [k for k in row if k.startswith("train_")]:
            if until is not None and row["epoch"] > until:
                del row[key]
            elif nan_after is not None and row["epoch"] > nan_after:
                row[key] = float("nan")
    path.write_text(json.dumps(rows))


def _legend_texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for lg in [ax.get_legend()] if lg for t in lg.get_texts()]


def test_a_seed_not_scored_on_train_after_a_resume_without_eval_train_did_not_diverge(tmp_path, figures):
    """train.eval_train is a change a checkpoint resumes with: rnn's seed 1, trained to epoch 1 with it and resumed
    to 3 without it, has no train value after epoch 1, and the train curves called it "diverged (no finite value
    after epoch 1; trained to 3)" and counted it in the legend's "2 seeds, 1 diverged". It is not scored there:
    the curve is seed 0 alone after epoch 1 (dotted), the legend counts no divergence, the note says why; lstm's
    seed 1, never scored on train, likewise. Its test curves are whole."""
    root = tmp_path / "project"
    for v in ("rnn", "lstm"):
        for seed in (0, 1):
            _write_run(root, "swimmer", v, seed, "continuous", [3.0 + seed, 2.0 + seed, 1.0 + seed, 0.8 + seed])
    _keep_train_values(root, "swimmer", "rnn", 1, until=1)
    _keep_train_values(root, "swimmer", "lstm", 1, until=-1)
    write_report(root, tmp_path / "reports", figures={"per_dataset": {"split": "train"}, "fig4a": {"split": "train"}})
    for name in ("swimmer_curves.png", "fig4a.png"):
        labels = _legend_texts(figures[name])
        assert "rnn (2 seeds)" in labels and "lstm (2 seeds)" in labels, (name, labels)
        assert not any("diverged" in label for label in labels), (name, labels)
    lines = {ln.get_label(): ln for ln in figures["swimmer_curves.png"].axes[0].get_lines()}
    solid = np.asarray(lines["rnn (2 seeds)"].get_ydata(), dtype=float)
    dotted = np.asarray(lines["_rnn (fewer seeds)"].get_ydata(), dtype=float)
    assert solid[:2] == pytest.approx([3.5, 2.5]) and np.isnan(solid[2:]).all()
    assert dotted[1:] == pytest.approx([2.5, 1.0, 0.8])          # seed 0 alone after epoch 1
    md = (tmp_path / "reports" / "results.md").read_text()
    assert "diverged" not in md
    assert ("- `swimmer_curves.png`: `rnn` seed 1 not scored on train after epoch 1 (trained to 3) (seed 0 at 3); "
            "the curve is dotted where it is the mean of fewer seeds") in md
    assert "- `swimmer_curves.png`: `lstm` seed 1 not scored on train (trained to 3) (seed 0 at 3)" in md
    assert "- `fig4a.png`: `swimmer` `rnn` seed 1 not scored on train after epoch 1 (trained to 3)" in md
    # the test split, scored every epoch, has every seed to the end
    write_report(root, tmp_path / "test_split")
    assert {"rnn (2 seeds)", "lstm (2 seeds)"} <= set(_legend_texts(figures["swimmer_curves.png"]))
    assert "not scored" not in (tmp_path / "test_split" / "results.md").read_text()


def test_a_curve_every_seed_stopped_being_scored_on_at_one_epoch_says_so(tmp_path, figures):
    """Both seeds resumed without train.eval_train after epoch 1: the train curve is whole (every epoch it has
    averages both seeds) but ends at epoch 1 of 3, which nothing said; the note does, and no seed diverged."""
    root = tmp_path / "project"
    for seed in (0, 1):
        _write_run(root, "swimmer", "rnn", seed, "continuous", [3.0 + seed, 2.0 + seed, 1.0 + seed, 0.8 + seed])
        _keep_train_values(root, "swimmer", "rnn", seed, until=1)
    write_report(root, tmp_path / "reports", figures={"per_dataset": {"split": "train"}, "fig4a": {"split": "train"}})
    lines = {ln.get_label(): ln for ln in figures["swimmer_curves.png"].axes[0].get_lines()}
    assert "_rnn (fewer seeds)" not in lines
    assert list(lines["rnn (2 seeds)"].get_xdata()) == [0, 1]
    md = (tmp_path / "reports" / "results.md").read_text()
    assert ("- `swimmer_curves.png`: `rnn` not scored on train after epoch 1 (trained to 3; `train.eval_train` "
            "turned off on resuming)") in md
    assert "- `fig4a.png`: `swimmer` `rnn` not scored on train after epoch 1 (trained to 3" in md
    assert "diverged" not in md and "dotted" not in md
    write_report(root, tmp_path / "test_split")   # the test split is whole: no note
    assert "not scored" not in (tmp_path / "test_split" / "results.md").read_text()


def test_a_seed_whose_train_values_turned_nan_still_diverged(tmp_path, figures):
    """The same run with its train values present but NaN after epoch 1 (not absent): diverged, as before."""
    root = tmp_path / "project"
    for seed in (0, 1):
        _write_run(root, "swimmer", "rnn", seed, "continuous", [3.0 + seed, 2.0 + seed, 1.0 + seed, 0.8 + seed])
    _keep_train_values(root, "swimmer", "rnn", 1, nan_after=1)
    write_report(root, tmp_path / "reports", figures={"per_dataset": {"split": "train"}, "fig4a": {"split": "train"}})
    for name in ("swimmer_curves.png", "fig4a.png"):
        assert "rnn (2 seeds, 1 diverged)" in _legend_texts(figures[name]), name
    md = (tmp_path / "reports" / "results.md").read_text()
    assert ("- `swimmer_curves.png`: `rnn` seed 1 diverged (no finite value after epoch 1; trained to 3) (seed 0 "
            "at 3); the curve is dotted where it is the mean of fewer seeds") in md
    assert "not scored" not in md


def test_a_star_marks_the_scored_epochs_value_where_it_is_not_the_curves_last_point(tmp_path, figures):
    """With train.restore_best the table's value is that of the best epoch's weights, not the curve's last point,
    and nothing in the figure showed where it was: a star in the variant's colour marks it (the mean over the seeds
    scored with that epoch), explained once in the legend; figures of runs scored at their last epoch have none."""
    from matplotlib.colors import to_rgba

    root = tmp_path / "project"
    _write_run(root, "swimmer", "gru", 0, "continuous", [1.0, 0.5, 0.6, 0.7], extra={"model_epoch": 1, "epochs": 3})
    _write_run(root, "swimmer", "gru", 1, "continuous", [1.0, 0.3, 0.6, 0.4], extra={"model_epoch": 1, "epochs": 3})
    _write_run(root, "swimmer", "lstm", 0, "continuous", [1.0, 0.9, 0.8, 0.75], extra={"model_epoch": 2, "epochs": 3})
    _write_run(root, "swimmer", "lstm", 1, "continuous", [1.0, 0.9, 0.8, 0.7], extra={"model_epoch": 3, "epochs": 3})
    _write_run(root, "swimmer", "kf", 0, "continuous", [1.0, 0.9, 0.8, 0.75], extra={"model_epoch": 3, "epochs": 3})
    _write_run(root, "mocap", "kf", 0, "continuous", [1.0, 0.9, 0.8, 0.75], extra={"model_epoch": 3, "epochs": 3})
    write_report(root, tmp_path / "reports")
    ax = figures["swimmer_curves.png"].axes[0]
    stars = {ln.get_label(): ln for ln in ax.get_lines() if ln.get_marker() == "*"}
    assert set(stars) == {"_gru scored", "_lstm scored", report.SCORED_LABEL}
    assert list(stars["_gru scored"].get_xdata()) == [1]
    assert list(stars["_gru scored"].get_ydata()) == pytest.approx([0.4])           # (0.5 + 0.3) / 2
    assert list(stars["_lstm scored"].get_xdata()) == [2, 3]                        # each seed's own epoch
    assert list(stars["_lstm scored"].get_ydata()) == pytest.approx([0.8, 0.7])
    assert to_rgba(stars["_gru scored"].get_color()) == to_rgba(_lines(ax)["gru (2 seeds)"].get_color())
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend.count(report.SCORED_LABEL) == 1
    fig4a = [t.get_text() for a in figures["fig4a.png"].axes for lg in [a.get_legend()] if lg for t in lg.get_texts()]
    assert fig4a.count(report.SCORED_LABEL) == 1
    # scored at the last epoch: no star, no legend entry
    assert not [ln for ln in figures["mocap_curves.png"].axes[0].get_lines() if ln.get_marker() == "*"]
    md = (tmp_path / "reports" / "results.md").read_text()
    sections = {part.split(" ")[0]: part for part in md.split("\n## ")}
    assert "A star on a figure's curve marks the scored epoch's value" in sections["swimmer"]
    assert "star" not in sections["mocap"]


def test_fig4a_has_one_legend_entry_a_variant_and_says_each_panels_rates_in_the_panel(tmp_path, figures):
    """The continuous-lr override's fig4a listed "kf (2 seeds, lr 0.1)" and "kf (2 seeds, lr 0.01)" in its one
    legend, two entries of one look for one variant: the legend has an entry a variant, and each panel says its
    own rates under its title ("lr 1" alone where the panel's share it); where every curve of the figure trained
    at one rate, nothing says it."""
    root = tmp_path / "project"
    rates = {"swimmer": {"kf": 0.1, "rnn": 1.0, "psrnn": 0.1}, "mocap": {"kf": 1.0, "rnn": 1.0, "psrnn": 1.0},
             "handwriting": {"kf": 0.01, "rnn": 1.0, "psrnn": 1.0}}
    for ds, by_v in rates.items():
        for v, lr in by_v.items():
            for seed in (0, 1):
                _write_run(root, ds, v, seed, "continuous", [1.0, 0.5], extra={"lr": lr})
    write_report(root, tmp_path / "reports")
    fig = figures["fig4a.png"]
    legend = [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
    assert legend[:3] == ["kf (2 seeds)", "rnn (2 seeds)", "psrnn (2 seeds)"] and len(legend) == 3
    notes = [[t.get_text() for t in ax.texts if t.get_text().startswith("lr ")] for ax in fig.axes]
    assert notes == [["lr 1: rnn; 0.1: others"], ["lr 1"], ["lr 0.01: kf; 1: others"]]
    assert [ax.get_title() for ax in fig.axes] == ["swimmer", "mocap", "handwriting"]
    # one rate for all: no note, and no lr in the legend
    for ds, by_v in rates.items():
        for v in by_v:
            for seed in (0, 1):
                _write_run(root, ds, v, seed, "continuous", [1.0, 0.5], extra={"lr": 1.0})
    write_report(root, tmp_path / "reports")
    fig = figures["fig4a.png"]
    assert not [t for ax in fig.axes for t in ax.texts if t.get_text().startswith("lr")]
    assert [t.get_text() for t in fig.axes[-1].get_legend().get_texts()] == [
        "kf (2 seeds)", "rnn (2 seeds)", "psrnn (2 seeds)"]


def test_reference_values_are_written_beside_the_panels_clear_of_curves_each_other_and_the_next_panel(tmp_path,
                                                                                                   figures):
    """The values of the naive predictors' lines and the Bayes optimum were written inside the panel at its right
    end, over the curves' last points: they are written just outside the panel, at their lines' heights, apart
    from each other, before the next panel's tick labels and the legend."""
    root = tmp_path / "project"
    naive = {"unigram": {"bpc": 2.31, "accuracy": 0.18}, "bigram": {"bpc": 2.3, "accuracy": 0.3}}
    for v, end in (("psrnn", 2.305), ("lstm", 2.1)):
        _write_run(root, "hmm", v, 0, "discrete", [4.0, 3.0, end], accuracy=[0.2, 0.3, 0.31], bayes={"bpc": 2.0},
                   extra={"naive": naive})
    for ds in ("swimmer", "mocap", "handwriting"):
        for v in ("kf", "lstm"):
            _write_run(root, ds, v, 0, "continuous", [1.0, 0.5, 0.0301],
                       extra={"naive": {"last_value": {"mse": 0.03}, "train_mean": {"mse": 1.0}}})
    write_report(root, tmp_path / "reports")
    for name in ("hmm_curves.png", "fig4a.png"):
        fig = figures[name]
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        axes = fig.axes
        legend = axes[-1].get_legend().get_window_extent(renderer)
        for i, ax in enumerate(axes):
            frame = ax.get_window_extent(renderer)
            boxes = [t.get_window_extent(renderer) for t in ax.texts if not t.get_text().startswith("lr ")]
            assert boxes, (name, i)
            for box in boxes:
                assert box.x0 >= frame.x1 and box.y0 >= frame.y0 - 8 and box.y1 <= frame.y1 + 8, (name, i)
                assert box.x1 <= fig.bbox.x1
                if i + 1 < len(axes):   # before the next panel's y tick labels and label
                    nxt = axes[i + 1].get_tightbbox(renderer)
                    assert box.x1 < nxt.x0, (name, i)
                else:
                    assert box.x1 < legend.x0, (name, i)
            for j, a in enumerate(boxes):
                assert not any(a.overlaps(b) for b in boxes[j + 1:]), (name, i, [t.get_text() for t in ax.texts])
