"""psrnn compare: a report summary against a reference, number by number."""

import copy
import json
import re
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.compare import compare_summaries, format_comparison, load_summary, resolve_summary

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"

BASE = {
    "hmm": {
        "psrnn": {"seeds": 2, "test_bpc": 2.0, "test_bpc_std": 0.01, "init_test_bpc": 2.5, "n_params": 100,
                  "optimal_bpc": 1.8, "gap_bpc": 0.2},
        "lstm": {"seeds": 2, "test_bpc": 1.9, "test_bpc_std": 0.02, "init_test_bpc": 2.6, "n_params": 50},
        "naive_unigram": {"test_bpc": 2.3},
    },
    "swimmer": {"kf": {"seeds": 2, "test_mse": 0.5, "test_mse_std": None, "init_test_mse": 0.7, "n_params": 9}},
}


def _verdicts(result):
    return {(r.dataset, r.variant, r.key): r.verdict for r in result.rows}


def test_a_summary_against_itself_is_the_same_number_for_number():
    result = compare_summaries(BASE, copy.deepcopy(BASE))
    assert set(_verdicts(result).values()) == {"same"} and result.agrees
    # the stds and the gap (derived) are not numbers of their own; seeds, optimal and n_params are
    assert sorted(k for d, v, k in _verdicts(result) if v == "psrnn") == [
        "init_test_bpc", "n_params", "optimal_bpc", "seeds", "test_bpc"]
    assert result.counts()["same"] == 5 + 4 + 1 + 4


def test_a_naive_predictor_on_one_side_only_is_a_newer_yardstick_not_a_lost_variant():
    """The bigram joined the naive predictors after the Xeon snapshots: its row in a new summary is the data's
    yardstick, not a variant the reference lacks, so it is said and --check still passes; a model variant on one
    side only still fails it."""
    ours = copy.deepcopy(BASE)
    ours["hmm"]["naive_bigram"] = {"test_bpc": 2.1, "test_accuracy": 0.4}
    for a, b in ((ours, BASE), (BASE, ours)):
        result = compare_summaries(a, b)
        assert result.agrees and result.one_sided_naive == ["hmm naive_bigram"]
        assert not any(r.variant == "naive_bigram" for r in result.rows)
        assert format_comparison(result, "a", "b").splitlines()[-1] == (
            "note: 1 naive predictor row(s) on one side only (hmm naive_bigram): a yardstick the other summary "
            "predates, not compared")
    ours["hmm"]["gru"] = ours["hmm"]["lstm"]
    assert not compare_summaries(ours, BASE).agrees


def test_each_verdict_at_its_bound():
    ours = copy.deepcopy(BASE)
    ours["hmm"]["psrnn"]["init_test_bpc"] = 2.5 * (1 + 5e-7)           # same (<= 1e-6 relative)
    ours["hmm"]["lstm"]["init_test_bpc"] = 2.6 * (1 + 5e-4)            # close (<= 1e-3)
    ours["hmm"]["psrnn"]["test_bpc"] = 2.0 + 0.029                     # within the spread 0.01 + 0.02
    ours["hmm"]["psrnn"]["test_bpc_std"] = 0.02
    ours["hmm"]["lstm"]["test_bpc"] = 1.9 + 0.041                      # beyond 0.02 + 0.02
    ours["hmm"]["naive_unigram"]["test_bpc"] = 2.31                    # no spread: a 4e-3 move differs
    ours["swimmer"]["kf"]["test_mse"] = 0.6                            # std null on both sides: no spread
    ours["hmm"]["psrnn"]["n_params"] = 101
    result = compare_summaries(ours, BASE)
    v = _verdicts(result)
    assert v["hmm", "psrnn", "init_test_bpc"] == "same"
    assert v["hmm", "lstm", "init_test_bpc"] == "close"
    assert v["hmm", "psrnn", "test_bpc"] == "within spread"
    assert v["hmm", "lstm", "test_bpc"] == "differs"
    assert v["hmm", "naive_unigram", "test_bpc"] == "differs"
    assert v["swimmer", "kf", "test_mse"] == "differs"
    assert v["hmm", "psrnn", "n_params"] == "differs"
    assert not result.agrees
    row = next(r for r in result.rows if r.key == "test_bpc" and r.variant == "psrnn")
    assert (row.ours, row.reference, row.ours_std, row.reference_std) == (2.029, 2.0, 0.02, 0.01)
    assert row.relative == pytest.approx(0.0145)
    # a looser rtol makes the 5e-4 move of a model's epoch-0 metric close, never a move of the data's numbers (a
    # naive predictor's, the Bayes optimum) or another model (a parameter count, even one in ten million)
    ours["hmm"]["psrnn"]["optimal_bpc"] = BASE["hmm"]["psrnn"]["optimal_bpc"] * (1 + 1e-4)
    ours["hmm"]["lstm"]["n_params"] = BASE["hmm"]["lstm"]["n_params"] * 10 ** 7 + 1
    base = copy.deepcopy(BASE)
    base["hmm"]["lstm"]["n_params"] *= 10 ** 7
    v = _verdicts(compare_summaries(ours, base, rtol=5e-3))
    assert v["hmm", "lstm", "init_test_bpc"] == "close"
    assert [v["hmm", "naive_unigram", "test_bpc"], v["hmm", "psrnn", "optimal_bpc"], v["hmm", "psrnn", "n_params"],
            v["hmm", "lstm", "n_params"]] == ["differs"] * 4
    for bad in (0.0, 1e-7, 1.0, float("nan"), "0.1"):
        with pytest.raises(ValueError, match=r"^rtol .*: expected a number from 1e-06 \(same\) to below 1$"):
            compare_summaries(ours, BASE, rtol=bad)


def test_one_sided_variants_datasets_and_numbers():
    ours = copy.deepcopy(BASE)
    del ours["hmm"]["lstm"]
    ours["hmm"]["gru"] = {"seeds": 1, "test_bpc": 1.95, "test_bpc_std": None}
    del ours["swimmer"]
    ours["mocap"] = {"psrnn": {"seeds": 1, "test_mse": 0.3}}
    ours["hmm"]["psrnn"]["test_bpc_finite"] = 1          # one of its two seeds gave NaN
    ours["hmm"]["psrnn"]["seeds"] = 2
    del ours["hmm"]["psrnn"]["optimal_bpc"]
    result = compare_summaries(ours, BASE)
    v = _verdicts(result)
    assert v["hmm", "lstm", "-"] == "only reference" and v["hmm", "gru", "-"] == "only ours"
    assert v["hmm", "psrnn", "test_bpc_finite"] == "differs"       # 1 against the reference's 2 (all finite)
    assert v["hmm", "psrnn", "optimal_bpc"] == "differs"           # missing on our side
    assert (result.only_ours, result.only_reference) == (["mocap"], ["swimmer"])
    text = format_comparison(result, "ours.json", "ref.json")
    assert text.splitlines()[0] == "ours.json against ref.json"
    assert text.splitlines()[-1] == ("7 numbers compared: 5 same, 0 close, 0 within spread, 2 differs; 1 variant(s) "
                                     "only ours, 1 variant(s) only reference; datasets only in ours: mocap; "
                                     "datasets only in the reference: swimmer")
    header, *rows = text.splitlines()[1:-1]
    assert header.split() == ["dataset", "variant", "number", "ours", "reference", "rel.", "diff", "verdict"]
    assert [r.split()[:3] for r in rows] == [["hmm", "gru", "-"], ["hmm", "lstm", "-"],
                                            ["hmm", "psrnn", "test_bpc_finite"], ["hmm", "psrnn", "optimal_bpc"]]
    assert rows[3].split()[3:] == ["-", "1.8", "-", "differs"]
    assert len(format_comparison(result, "a", "b", show_all=True).splitlines()) == 2 + len(result.rows) + 1


def test_the_shipped_snapshots_differ_only_where_the_override_retrains():
    """docs/reference/continuous-lr is the default run followed by the README's override, which retrains some
    variants of Swimmer, Handwriting and Mocap at other learning rates: every other number of the two snapshots,
    the epoch-0 metrics of every model included, is the same."""
    retrained = {"swimmer": {"psrnn", "kf", "psrnn_2layer", "factorized_psrnn_r10", "factorized_psrnn_r40"},
                 "handwriting": {"psrnn", "kf", "psrnn_2layer", "factorized_psrnn_r40"},
                 "mocap": {"kf", "factorized_psrnn_r10"}}
    default = load_summary(REFERENCE / "default" / "summary.json")
    result = compare_summaries(load_summary(REFERENCE / "continuous-lr" / "summary.json"), default)
    assert result.only_ours == result.only_reference == []
    moved = {(r.dataset, r.variant) for r in result.rows if r.verdict != "same"}
    # their final test MSE and, in snapshots that record it, their learning rate
    assert {(r.dataset, r.variant, r.key) for r in result.rows if r.verdict != "same"} == {
        (d, v, k) for d, v in moved for k in ("test_mse", "lr") if k != "lr" or "lr" in default[d][v]}
    assert moved and all(v in retrained.get(d, ()) for d, v in moved), moved


def test_the_shipped_snapshot_agrees_with_the_xeon_one_as_the_docs_say():
    """docs/reference/README.md (and the README's "Reference results") quote these counts and the three numbers
    that differ between the AMD snapshot and the Intel Xeon one it replaced; the Xeon summaries predate lr."""
    for name, counts, differing in (
            ("default", {"same": 237, "close": 22, "within spread": 26, "differs": 3},
             {("hmm", "psrnn", "test_bpc"), ("swimmer", "factorized_psrnn_r10", "test_mse"),
              ("swimmer", "kf", "test_mse")}),
            ("continuous-lr", {"same": 241, "close": 23, "within spread": 23, "differs": 1},
             {("hmm", "psrnn", "test_bpc")})):
        ours = load_summary(REFERENCE / name / "summary.json")
        result = compare_summaries(ours, load_summary(REFERENCE / f"{name}-xeon-61beb63" / "summary.json"))
        assert {k: result.counts()[k] for k in counts} == counts, name
        assert {(r.dataset, r.variant, r.key) for r in result.rows if r.verdict == "differs"} == differing
        rows = [row for ds in ours.values() for v, row in ds.items() if not v.startswith("naive_")]
        assert all("lr" in row for row in rows)
        # each seed's values, so that a one-seed run is compared with the same seed's
        assert all({f"{k}@s{seed}" for k in row if k.startswith(("test_", "init_test_")) and not k.endswith(
            ("_std", "_data_units", "_finite")) and "@s" not in k for seed in (0, 1)} <= set(row) for row in rows)


def test_load_summary_names_the_file_and_what_is_wrong(tmp_path):
    path = tmp_path / "summary.json"
    with pytest.raises(FileNotFoundError, match=rf"^{path}: file not found; expected the report stage's summary"):
        load_summary(path)
    for text, message in (
            ("{", r"not valid JSON \(Expecting property name"),
            ("[1, 2]", r"a JSON array, not an object; expected \{dataset: \{variant: \{key: number\}\}\}"),
            ("null", r"a JSON null, not an object"),
            ('{"hmm": 3}', r"hmm is a JSON number, not an object"),
            ('{"hmm": {"psrnn": [1]}}', r"hmm\.psrnn is a JSON array, not an object"),
            ('{"hmm": {"psrnn": {"test_bpc": "2.0"}}}', r'hmm\.psrnn\.test_bpc is the JSON string "2\.0", not a number'),
            ('{"hmm": {"psrnn": {"seeds": true}}}', r"hmm\.psrnn\.seeds is the JSON boolean true, not a number"),
            ('{"hmm": {"psrnn": {"n": 1' + "0" * 400 + '}}}',
             r"hmm\.psrnn\.n is an integer of 401 digits, beyond a float's range"),
            ('{"n": 1' + "0" * 5000 + '}', r"not a summary json can read \(Exceeds the limit"),
            ("[" * 100000, r"not a summary json can read \(maximum recursion depth")):
        path.write_text(text)
        with pytest.raises(ValueError, match=rf"^{path}: {message}"):
            load_summary(path)
    path.write_text('{"hmm": {"psrnn": {"test_bpc": 2.0, "test_bpc_std": null}}}')
    assert load_summary(path) == {"hmm": {"psrnn": {"test_bpc": 2.0, "test_bpc_std": None}}}
    folder = tmp_path / "folder.json"   # a directory where the file was to be
    folder.mkdir()
    with pytest.raises(OSError) as err:
        load_summary(folder)
    assert str(err.value).endswith(f"{folder}: cannot read it (Is a directory); expected a summary.json file")
    # Python's JSON takes NaN and Infinity: NaN on both sides is the same, NaN against a number differs
    path.write_text('{"hmm": {"psrnn": {"test_bpc": NaN, "init_test_bpc": Infinity, "n_params": 3}}}')
    other = tmp_path / "other.json"
    other.write_text('{"hmm": {"psrnn": {"test_bpc": NaN, "init_test_bpc": 2.0, "n_params": 3}}}')
    v = _verdicts(compare_summaries(load_summary(path), load_summary(other)))
    assert v == {("hmm", "psrnn", "test_bpc"): "same", ("hmm", "psrnn", "init_test_bpc"): "differs",
                 ("hmm", "psrnn", "n_params"): "same"}


def test_resolve_summary_defaults_folders_and_snapshot_names(tmp_path):
    assert resolve_summary(None, ROOT, reference=False) == ROOT / "reports" / "summary.json"
    assert resolve_summary(None, ROOT, reference=True) == REFERENCE / "default" / "summary.json"
    assert resolve_summary("continuous-lr", ROOT, reference=True) == REFERENCE / "continuous-lr" / "summary.json"
    assert resolve_summary(str(tmp_path), ROOT, reference=False) == tmp_path / "summary.json"
    assert resolve_summary("mine.json", ROOT, reference=False) == Path("mine.json")   # ours: never a snapshot
    with pytest.raises(FileNotFoundError) as err:
        resolve_summary("continuous_lr", ROOT, reference=True)
    assert str(err.value) == (f"continuous_lr: no such summary file, nor a reference snapshot "
                              f"{REFERENCE / 'continuous_lr'}; expected a summary.json path or one of: "
                              "continuous-lr, continuous-lr-xeon-61beb63, default, default-xeon-61beb63, ptb-40-epochs")


def test_cli_compare_prints_the_table_and_checks(tmp_path, capsys):
    """The command needs no params.yaml (it reads two JSON files); --check turns a difference into status 1."""
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps(BASE))
    ours = copy.deepcopy(BASE)
    ours["hmm"]["lstm"]["test_bpc"] = 2.5
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "summary.json").write_text(json.dumps(ours))
    assert cli.main(["--root", str(tmp_path), "compare", "--reference", str(ref)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "reports/summary.json against ref.json"   # paths inside the project: relative to it
    assert out[2].split() == ["hmm", "lstm", "test_bpc", "2.5", "±", "0.02", "1.9", "±", "0.02", "+3.2e-01",
                              "differs"]
    assert out[-1] == "14 numbers compared: 13 same, 0 close, 0 within spread, 1 differs"
    assert cli.main(["--root", str(tmp_path), "compare", "--reference", str(ref), "--check"]) == 1
    capsys.readouterr()
    assert cli.main(["--root", str(tmp_path), "compare", str(ref), "--reference", str(ref), "--check"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "14 numbers compared: 14 same, 0 close, 0 within spread, 0 differs"]
    assert cli.main(["--root", str(tmp_path), "compare", "--reference", str(ref), "--rtol", "0.5", "--check"]) == 0
    capsys.readouterr()
    # could not compare: 2, as diff says trouble, so that --check's 1 means the numbers differ
    assert cli.main(["--root", str(tmp_path), "compare", str(tmp_path / "none.json"), "--reference", str(ref),
                     "--check"]) == 2
    assert capsys.readouterr().err.strip() == (f"psrnn compare: error: {tmp_path / 'none.json'}: file not found; "
                                               "expected the report stage's summary.json (run `dvc repro`, or name "
                                               "a file)")
    # a project without the shipped snapshots (a user's own): the default reference is named as missing
    assert cli.main(["--root", str(tmp_path), "compare"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"psrnn compare: error: {tmp_path / 'docs' / 'reference' / 'default' / 'summary.json'}: file not found; "
        "expected a reference snapshot's summary.json (docs/reference/<name>/ of a clone of psrnn-pipeline, or "
        "--reference FILE)")


def test_a_one_seed_run_against_the_two_seed_reference():
    """The README's quick pass (one seed): its epoch-0 metrics are one 2SR draw against the mean of two, not
    comparable ('other seeds', no difference for --check), nor is the seed count itself (a setting: it made --check
    fail every one-seed run), and the final metric is judged by the reference's spread."""
    ours = {"hmm": {"psrnn": {"seeds": 1, "test_bpc": 2.009, "test_bpc_std": None, "init_test_bpc": 2.6,
                              "n_params": 100, "optimal_bpc": 1.8}}}
    v = _verdicts(compare_summaries(ours, {"hmm": {"psrnn": BASE["hmm"]["psrnn"]}}))
    assert v == {("hmm", "psrnn", "seeds"): "other seeds", ("hmm", "psrnn", "test_bpc"): "within spread",
                 ("hmm", "psrnn", "init_test_bpc"): "other seeds", ("hmm", "psrnn", "n_params"): "same",
                 ("hmm", "psrnn", "optimal_bpc"): "same"}
    result = compare_summaries(ours, {"hmm": {"psrnn": BASE["hmm"]["psrnn"]}})
    assert format_comparison(result, "a", "b").splitlines()[-2:] == [
        "5 numbers compared: 2 same, 0 close, 1 within spread, 0 differs; not comparable: 2 of other seeds",
        "note: 1 row(s) of other seeds (hmm psrnn) could not be compared seed by seed (a summary without "
        "per-seed values, or no seed in common): their final metrics are means over other seeds, held to the seed "
        "spread, which one seed often exceeds"]
    assert compare_summaries(ours, {"hmm": {"psrnn": BASE["hmm"]["psrnn"]}}).agrees
    # with equal seed counts an epoch-0 metric is compared as any other number
    ours["hmm"]["psrnn"]["seeds"] = 2
    assert _verdicts(compare_summaries(ours, {"hmm": {"psrnn": BASE["hmm"]["psrnn"]}}))[
        "hmm", "psrnn", "init_test_bpc"] == "differs"


def test_a_one_seed_run_is_compared_seed_by_seed_where_both_summaries_keep_each_seed():
    """A one-seed quick pass against the two-seed reference compared its seed's final metric with the mean of two
    other draws, held to their spread: a run that matched the reference's seed 0 exactly could "differ". Where
    both summaries keep per-seed values (test_bpc@s0), the seeds both ran are compared one by one: the epoch-0
    metric of the same 2SR draw is comparable again, and a seed's final metric is held to the reference's
    spread only where it is not the same."""
    ref = {"hmm": {"psrnn": {"seeds": 2, "test_bpc": 2.0, "test_bpc_std": 0.01, "init_test_bpc": 2.5,
                             "test_bpc@s0": 1.99, "test_bpc@s1": 2.01, "init_test_bpc@s0": 2.4,
                             "init_test_bpc@s1": 2.6, "n_params": 100, "lr": 1.0}}}
    ours = {"hmm": {"psrnn": {"seeds": 1, "test_bpc": 1.99, "test_bpc_std": None, "init_test_bpc": 2.4,
                              "test_bpc@s0": 1.99, "init_test_bpc@s0": 2.4, "n_params": 100, "lr": 1.0}}}
    result = compare_summaries(ours, ref)
    assert _verdicts(result) == {("hmm", "psrnn", "seeds"): "other seeds", ("hmm", "psrnn", "test_bpc@s0"): "same",
                                 ("hmm", "psrnn", "init_test_bpc@s0"): "same", ("hmm", "psrnn", "n_params"): "same",
                                 ("hmm", "psrnn", "lr"): "same"}
    assert "note" not in format_comparison(result, "a", "b")
    # the same seed on another CPU: within the reference's spread, else it differs; its 2SR start must agree
    ours["hmm"]["psrnn"].update({"test_bpc@s0": 1.999, "init_test_bpc@s0": 2.41})
    v = _verdicts(compare_summaries(ours, ref))
    assert v["hmm", "psrnn", "test_bpc@s0"] == "within spread" and v["hmm", "psrnn", "init_test_bpc@s0"] == "differs"
    # the ± shown beside that seed's number is the row's spread over seeds, and the table says so
    text = format_comparison(compare_summaries(ours, ref), "a", "b")
    assert re.search(r"test_bpc@s0 +1\.999 +1\.99 ± 0\.0\d+ ", text), text
    assert text.splitlines()[-1] == ("note: ± beside one seed's number (a key ending in @s<seed>) is the spread over "
                                     "the seeds of its row's mean, the yardstick of 'within spread', not the seed's "
                                     "own")
    ours["hmm"]["psrnn"]["test_bpc@s0"] = 2.2
    assert _verdicts(compare_summaries(ours, ref))["hmm", "psrnn", "test_bpc@s0"] == "differs"
    # a seed the reference did not run: nothing to match, the means as before
    ours["hmm"]["psrnn"] = {k.replace("@s0", "@s7"): v for k, v in ours["hmm"]["psrnn"].items()}
    assert set(_verdicts(compare_summaries(ours, ref))) == {
        ("hmm", "psrnn", k) for k in ("seeds", "test_bpc", "init_test_bpc", "n_params", "lr")}
    # equal seed counts: the means, as the docs' counts are (per-seed values not compared on their own)
    assert not any("@s" in r.key for r in compare_summaries(ref, ref).rows)
    # the verdict does not depend on which summary is ours: the spread is whichever side has one
    ours["hmm"]["psrnn"] = {"seeds": 1, "test_bpc": 1.999, "test_bpc_std": None, "test_bpc@s0": 1.999,
                            "n_params": 100, "lr": 1.0}
    for a, b in ((ours, ref), (ref, ours)):
        assert _verdicts(compare_summaries(a, b))["hmm", "psrnn", "test_bpc@s0"] == "within spread"
    # seeds that only ours ran are said not to be compared (a wild seed 2 passed --check unseen); the seed count is
    # a setting whatever --rtol
    three = copy.deepcopy(ref)
    three["hmm"]["psrnn"].update({"seeds": 3, "test_bpc@s2": 9.0})
    result = compare_summaries(three, ref, rtol=0.6)
    assert _verdicts(result)["hmm", "psrnn", "seeds"] == "other seeds" and result.unmatched_seeds == [
        "hmm psrnn (seed 2)"]
    assert format_comparison(result, "a", "b").splitlines()[-1] == (
        "note: 1 row(s) ran seeds the reference did not (hmm psrnn (seed 2)): compared seed by seed on the seeds "
        "both ran, those seeds' numbers are not compared")
    assert compare_summaries(ref, three).unmatched_seeds == []   # the reference's extra seeds: a shorter run
    # at another learning rate a seed's final metric is not comparable either, a diverged one (null) included
    other = copy.deepcopy(ref)
    other["hmm"]["psrnn"].update({"seeds": 1, "lr": 0.1, "test_bpc@s0": None, "init_test_bpc@s0": 2.4})
    del other["hmm"]["psrnn"]["test_bpc@s1"], other["hmm"]["psrnn"]["init_test_bpc@s1"]
    v = _verdicts(compare_summaries(other, ref))
    assert v["hmm", "psrnn", "test_bpc@s0"] == "other lr" and v["hmm", "psrnn", "init_test_bpc@s0"] == "same"
    # keys of no seed number (hand-made) are not per-seed values
    odd = copy.deepcopy(ours)
    odd["hmm"]["psrnn"]["test_bpc@s\u00b2"] = 1.0
    assert "hmm" in compare_summaries(odd, ref).rows[0].dataset


def test_as_many_seeds_but_others_are_other_seeds():
    """Seeds 1 against seeds 0, or 0 and 1 against 1 and 2: the counts agree, the runs do not. Their means were
    compared as numbers of the same runs (a seed-1 quick pass "differed" eight times against seed 0 with no word,
    and a seed renamed from 1 to 5 was "the same"); where both summaries keep each seed's values they are now rows
    of other seeds, compared seed by seed on the seeds both ran."""
    ref = {"hmm": {"psrnn": {"seeds": 2, "test_bpc": 2.0, "test_bpc_std": 0.01, "init_test_bpc": 2.5,
                             "test_bpc@s0": 1.99, "test_bpc@s1": 2.01, "init_test_bpc@s0": 2.4,
                             "init_test_bpc@s1": 2.6, "n_params": 100}}}
    ours = {"hmm": {"psrnn": {"seeds": 2, "test_bpc": 2.02, "test_bpc_std": 0.01, "init_test_bpc": 2.55,
                              "test_bpc@s1": 2.01, "test_bpc@s2": 2.03, "init_test_bpc@s1": 2.6,
                              "init_test_bpc@s2": 2.5, "n_params": 100}}}
    result = compare_summaries(ours, ref)
    assert _verdicts(result) == {("hmm", "psrnn", "seeds"): "other seeds", ("hmm", "psrnn", "test_bpc@s1"): "same",
                                 ("hmm", "psrnn", "init_test_bpc@s1"): "same", ("hmm", "psrnn", "n_params"): "same"}
    assert result.unmatched_seeds == ["hmm psrnn (seed 2)"] and result.agrees
    # seed 1 renamed 5 (equal means): seed 0 compared, seed 5 named as not compared
    ours["hmm"]["psrnn"] = {k.replace("@s1", "@s5"): v for k, v in ref["hmm"]["psrnn"].items()}
    result = compare_summaries(ours, ref)
    assert _verdicts(result) == {("hmm", "psrnn", "seeds"): "other seeds", ("hmm", "psrnn", "test_bpc@s0"): "same",
                                 ("hmm", "psrnn", "init_test_bpc@s0"): "same", ("hmm", "psrnn", "n_params"): "same"}
    assert result.unmatched_seeds == ["hmm psrnn (seed 5)"]
    # no seed in common: the epoch-0 means are other draws, the final ones held to the spread (none here), and a
    # note says so
    one = {"hmm": {"psrnn": {"seeds": 1, "test_bpc": 2.03, "init_test_bpc": 2.6, "test_bpc@s1": 2.03,
                             "init_test_bpc@s1": 2.6, "n_params": 100}}}
    zero = {"hmm": {"psrnn": {"seeds": 1, "test_bpc": 1.99, "init_test_bpc": 2.4, "test_bpc@s0": 1.99,
                              "init_test_bpc@s0": 2.4, "n_params": 100}}}
    result = compare_summaries(one, zero)
    assert _verdicts(result) == {("hmm", "psrnn", "seeds"): "other seeds", ("hmm", "psrnn", "test_bpc"): "differs",
                                 ("hmm", "psrnn", "init_test_bpc"): "other seeds", ("hmm", "psrnn", "n_params"): "same"}
    assert "note: 1 row(s) of other seeds (hmm psrnn) could not be compared seed by seed (a summary without per-seed " \
           "values, or no seed in common)" in format_comparison(result, "a", "b")
    # summaries without per-seed values cannot tell: the means, as before
    plain = [{"hmm": {"psrnn": {k: v for k, v in row["hmm"]["psrnn"].items() if "@s" not in k}}} for row in (one, zero)]
    assert _verdicts(compare_summaries(*plain))["hmm", "psrnn", "seeds"] == "same"


def test_counts_are_compared_exactly_whatever_the_tolerance():
    """A parameter count is another model and a count of finite seeds another outcome when they differ by one:
    10000001 against 10000000 parameters was 'same' (1e-7 relative), and 1 finite seed of 2 'close' at rtol 0.6."""
    ref = {"hmm": {"psrnn": {"seeds": 2, "test_bpc": 2.0, "test_bpc_std": 0.01, "n_params": 10_000_000,
                             "test_bpc_finite": 2}}}
    ours = copy.deepcopy(ref)
    ours["hmm"]["psrnn"].update(n_params=10_000_001, test_bpc_finite=1)
    result = compare_summaries(ours, ref, rtol=0.6)
    v = _verdicts(result)
    assert (v["hmm", "psrnn", "n_params"], v["hmm", "psrnn", "test_bpc_finite"]) == ("differs", "differs")
    assert not result.agrees


def test_datasets_shared_without_numbers_are_not_called_unshared():
    result = compare_summaries({"hmm": {"psrnn": {"test_bpc": None}}}, {"hmm": {"psrnn": {"test_bpc": None}}})
    assert result.rows == [] and result.shared == ["hmm"]
    assert format_comparison(result, "a", "b").splitlines()[-1] == (
        "0 numbers compared: 0 same, 0 close, 0 within spread, 0 differs (the datasets they share, hmm, have no "
        "numbers on both sides)")


def test_the_final_metrics_of_a_row_at_another_rate_are_not_comparable():
    """The note said rows trained at another rate are not comparable, while their final metrics counted as
    'differs' beside the lr itself: one difference of settings (lr) is what --check fails on."""
    ref = {"swimmer": {"psrnn": {"seeds": 2, "test_mse": 0.85, "test_mse_std": 1.2, "init_test_mse": 0.0063,
                                 "lr": 1.0}}}
    ours = copy.deepcopy(ref)
    ours["swimmer"]["psrnn"].update(test_mse=0.0049, test_mse_std=0.0002, lr=0.1)
    result = compare_summaries(ours, ref)
    assert _verdicts(result) == {("swimmer", "psrnn", "seeds"): "same", ("swimmer", "psrnn", "test_mse"): "other lr",
                                 ("swimmer", "psrnn", "init_test_mse"): "same", ("swimmer", "psrnn", "lr"): "differs"}
    assert format_comparison(result, "a", "b").splitlines()[-2] == (
        "4 numbers compared: 2 same, 0 close, 0 within spread, 1 differs; not comparable: 1 of another learning "
        "rate")
    # against a summary that predates lr: said, not compared
    del ref["swimmer"]["psrnn"]["lr"]
    assert format_comparison(compare_summaries(ours, ref), "a", "b").splitlines()[-1] == (
        "note: 1 row(s) have a learning rate on one side only (a summary written before the report recorded it): lr "
        "not compared there")


def test_check_fails_when_the_summaries_share_no_dataset(tmp_path, capsys):
    """After the README's first run (datasets: [custom]) the shipped snapshots, of the built-in sets, share nothing
    with it: --check must not pass a comparison that compared nothing."""
    ours, ref = tmp_path / "ours.json", tmp_path / "ref.json"
    ours.write_text(json.dumps({"custom": BASE["swimmer"]}))
    ref.write_text(json.dumps(BASE))
    assert cli.main(["--root", str(tmp_path), "compare", str(ours), "--reference", str(ref)]) == 0
    assert cli.main(["--root", str(tmp_path), "compare", str(ours), "--reference", str(ref), "--check"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == ("0 numbers compared: 0 same, 0 close, 0 within spread, 0 differs; datasets only in ours: "
                       "custom; datasets only in the reference: hmm, swimmer (the two summaries share no dataset)")


@pytest.mark.parametrize("flag, buffered", [
    ("--all", False),   # 34 kB, written as printed: a print fails inside the command
    (None, True),       # 1.5 kB, block-buffered: the flush at exit fails, after the command returned
])
def test_a_reader_that_closes_the_pipe_stops_the_command_quietly(tmp_path, flag, buffered):
    """`psrnn compare --all | head -1`: the reader is gone before the output is written. The command stops with
    SIGPIPE's status (141, as a Unix tool killed by it) and says nothing, instead of "error: [Errno 32] Broken
    pipe" on stderr (or, at exit, "Exception ignored ... BrokenPipeError" and status 120)."""
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "pipeline.cli", "--root", str(tmp_path), "compare",
           str(REFERENCE / "default" / "summary.json"), "--reference",
           str(REFERENCE / "continuous-lr" / "summary.json"), *([flag] if flag else [])]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED" or not buffered}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()   # before the child writes a byte: its first write (or its flush at exit) fails
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, stderr
    assert stderr == ""
    whole = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)   # read in full
    assert whole.returncode == 0, whole.stderr
    assert len(whole.stdout.splitlines()) > (100 if flag else 5) and whole.stderr == ""


def test_a_broken_pipe_that_is_not_stdout_is_an_error(tmp_path, monkeypatch, capsys):
    """Only a closed stdout is a reader that has read enough: a broken pipe of anything else (a socket, a
    subprocess) fails as any error does, and stdout stays as it was."""
    def broken(*args):
        raise BrokenPipeError(32, "Broken pipe", "the tracking server's socket")

    monkeypatch.setattr(cli, "_compare", broken)
    assert cli.main(["--root", str(tmp_path), "compare"]) == 2   # an OSError: one line, as for a failed download
    assert capsys.readouterr().err == (
        "psrnn compare: error: Broken pipe: \"the tracking server's socket\"\n")
    print("still here")
    assert capsys.readouterr().out == "still here\n"


def test_the_mse_in_data_units_is_not_compared_on_its_own():
    """summary.json's test_mse_data_units (standardised data, Swimmer's among them) is test_mse's errors in the
    data's units: a snapshot made before evaluate wrote it lacks it, which is no difference, and where both have it
    test_mse judges the run."""
    ours = copy.deepcopy(BASE)
    ours["swimmer"]["kf"].update(test_mse_data_units=0.02, test_mse_data_units_std=None)
    result = compare_summaries(ours, BASE)
    assert result.agrees and not any("data_units" in r.key for r in result.rows)
    assert compare_summaries(BASE, ours).agrees


def test_rows_of_another_parameter_count_are_named_as_other_models():
    """A tiny run compared with the full reference listed every number of its smaller models as "differs" and never
    said why: rows whose n_params differ are other models (other sizes in params.yaml), named in one note line."""
    ours = copy.deepcopy(BASE)
    ours["hmm"]["psrnn"]["n_params"] = 60
    ours["swimmer"]["kf"]["n_params"] = 5
    text = format_comparison(compare_summaries(ours, BASE), "ours.json", "reference.json")
    assert text.splitlines()[-1] == ("note: 2 row(s) have another parameter count (hmm psrnn, swimmer kf): those are "
                                     "other models (params.yaml's sizes differ from the reference's), so their "
                                     "numbers are not comparable")
    assert "note:" not in format_comparison(compare_summaries(BASE, copy.deepcopy(BASE)), "a", "b")
    # one parameter more is within the 'close' tolerance (1e-3 relative) but another model; a count one side lacks
    # is unknown, not another
    near = copy.deepcopy(BASE)
    near["swimmer"]["kf"]["n_params"] = 56110
    ref = copy.deepcopy(BASE)
    ref["swimmer"]["kf"]["n_params"] = 56103
    del ref["hmm"]["lstm"]["n_params"]
    text = format_comparison(compare_summaries(near, ref), "ours.json", "reference.json")
    assert text.splitlines()[-1].startswith("note: 1 row(s) have another parameter count (swimmer kf): ")


def test_a_row_trained_at_another_learning_rate_is_named():
    """summary.json's lr is a setting: equal or not (0.1 against 0.1001 is another rate, though 'close'); a
    snapshot that predates it is no difference; rows at another rate are named in a note, as rows of another size."""
    ours, ref = copy.deepcopy(BASE), copy.deepcopy(BASE)
    for summary in (ours, ref):
        summary["hmm"]["psrnn"]["lr"] = summary["hmm"]["lstm"]["lr"] = summary["swimmer"]["kf"]["lr"] = 1.0
    ours["hmm"]["psrnn"]["lr"] = 0.1
    ours["swimmer"]["kf"]["lr"] = 1.0001
    result = compare_summaries(ours, ref)
    verdicts = _verdicts(result)
    assert verdicts[("hmm", "psrnn", "lr")] == verdicts[("swimmer", "kf", "lr")] == "differs"
    assert verdicts[("hmm", "lstm", "lr")] == "same" and not result.agrees
    assert format_comparison(result, "ours.json", "reference.json").splitlines()[-1] == (
        "note: 2 row(s) were trained at another learning rate (hmm psrnn, swimmer kf): their final metrics are not "
        "comparable (\"other lr\"; their epoch-0 ones are)")
    # a summary without lr (a snapshot older than it) against one with it: nothing compared, which a note says
    older = compare_summaries(ours, BASE)
    assert older.agrees is compare_summaries(copy.deepcopy(BASE), BASE).agrees
    assert not any(r.key == "lr" for r in older.rows)
    assert "trained at another learning rate" not in format_comparison(older, "a", "b")
    assert "3 row(s) have a learning rate on one side only" in format_comparison(older, "a", "b")
    # seeds trained at several rates (null) against one rate differ
    ours["hmm"]["lstm"]["lr"] = None
    assert _verdicts(compare_summaries(ours, ref))[("hmm", "lstm", "lr")] == "differs"
