"""User mistakes that used to fail with a raw library error, or not at all, each now a one-line error naming the
file, key or value (or, where it is sensible, simply working):

* text that is not valid UTF-8 in a Parquet string column (a custom dataset, a ``psrnn predict`` input, a prepared
  file): pyarrow's "Unknown error: Wrapping t\\xff0 failed" named neither file nor column;
* CP decomposition of a degenerate 2SR tensor, or at a rank above what the tensor needs ("Singular matrix");
* ``psrnn predict`` / ``forecast`` outputs that would replace the project's own files (a checkpoint, a dataset);
* a mirror that does not exist or is a file, forgotten by the time the download fails offline;
* MLflow URIs that cannot hold runs (in-memory SQLite, mistyped URLs) and run ids that are not run ids.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.data.custom import load_custom

# ------------------------------------------------------------------------------------------------ UTF-8


def _text(values: list[bytes], large: bool = False) -> pa.Array:
    """A string array holding ``values``' bytes unchecked, as a writer that does not validate them leaves them."""
    raw = pa.array(values, pa.large_binary() if large else pa.binary())
    return pa.Array.from_buffers(pa.large_string() if large else pa.string(), len(raw), raw.buffers())


def _discrete_columns() -> dict[str, pa.Array]:
    n = 8
    return {"trajectory": _text([b"t0"] * 4 + [b"t1"] * 4), "step": pa.array(list(range(4)) * 2),
            "symbol": _text([b"a", b"b"] * 4), "split": _text([b"train"] * 4 + [b"test"] * 4),
            "note": _text([b"x"] * n)}


@pytest.mark.parametrize("name", ["trajectory", "symbol", "split"])
@pytest.mark.parametrize("large", [False, True])
def test_text_that_is_not_utf8_is_named_by_file_column_and_row(tmp_path, name, large):
    cols = _discrete_columns()
    values = [v.encode() for v in cols[name].to_pylist()]
    values[5] = b"t\xff0"
    cols[name] = _text(values, large)
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table(cols), path)
    with pytest.raises(ValueError) as err:
        load_custom(path, kind="discrete")
    assert str(err.value) == (
        f"{path}: column {name!r} is not valid UTF-8 text (first at row 5: b't\\xff0'); expected strings in UTF-8 "
        "(re-encode the text, e.g. from Latin-1, before writing the file)")


def test_dictionary_encoded_text_that_is_not_utf8_is_named_too(tmp_path):
    cols = _discrete_columns()
    cols["symbol"] = pa.DictionaryArray.from_arrays(pa.array([0, 1] * 4, pa.int32()), _text([b"a", b"\xe9t\xe9"]))
    path = tmp_path / "dict.parquet"
    pq.write_table(pa.table(cols), path)
    with pytest.raises(ValueError, match=r"column 'symbol' is not valid UTF-8 text \(first at row 1: "
                                         r"b'\\xe9t\\xe9'\)"):
        load_custom(path, kind="discrete")


def test_an_unused_text_column_that_is_not_utf8_is_dropped_like_any_text(tmp_path, caplog):
    """features=None looks at the first values of every text column for numbers written as text: bytes that are
    not UTF-8 are no numbers, so the column is dropped with the usual warning (it used to raise 'utf-8' codec
    can't decode byte 0xff)."""
    path = tmp_path / "note.parquet"
    pq.write_table(pa.table({"trajectory": np.repeat([0, 1, 2], 4), "x": np.arange(12.0),
                             "note": _text([b"ok"] * 5 + [b"t\xff0"] + [b"ok"] * 6)}), path)
    with caplog.at_level(logging.WARNING, logger="pipeline.data.custom"):
        ds = load_custom(path, kind="continuous", test_fraction=0.34)
    assert ds.features == ["x"]
    assert any("non-numeric columns dropped from the features" in r.getMessage() and "'note' (string)"
               in r.getMessage() for r in caplog.records)


def test_a_prepared_file_whose_split_is_not_utf8_is_named(tmp_path):
    from pipeline.data.schema import SequenceDataset, read_dataset, write_dataset

    path = tmp_path / "prepared.parquet"
    write_dataset(path, SequenceDataset(kind="discrete", train=[np.array([0, 1, 0])], test=[np.array([1, 0])],
                                        vocab=["a", "b"]))
    table = pq.read_table(path)
    split = [s.encode() for s in table.column("split").to_pylist()]
    split[3] = b"te\xffst"
    table = table.set_column(table.schema.get_field_index("split"), "split", _text(split))
    pq.write_table(table, path)
    with pytest.raises(ValueError) as err:
        read_dataset(path)
    assert str(err.value) == (
        f"{path}: column 'split' is not valid UTF-8 text (first at row 3: b'te\\xffst'); expected strings in UTF-8 "
        "(re-encode the text, e.g. from Latin-1, before writing the file)")


def test_a_predict_input_that_is_not_utf8_is_named_and_nothing_is_written(tmp_path):
    from pipeline.inference import TrainedRun, predict_file
    from pipeline.models import PSRNN, ModelConfig

    model = PSRNN(ModelConfig(model="psrnn", discrete=True, input_dim=2, output_dim=2, state_dim=3, obs_dim=2))
    run = TrainedRun.from_units(model, {"kind": "discrete", "vocab": ["a", "b"]}, dataset="mine", variant="psrnn",
                                seed=0, epoch=0)
    cols = _discrete_columns()
    cols["symbol"] = _text([b"a", b"b", b"a", b"\xffb", b"a", b"b", b"a", b"b"])
    path = tmp_path / "new.parquet"
    pq.write_table(pa.table(cols), path)
    with pytest.raises(ValueError) as err:
        predict_file(run, path, tmp_path / "out.parquet")
    assert str(err.value).startswith(f"{path}: column 'symbol' is not valid UTF-8 text (first at row 3: b'\\xffb')")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.parquet"]


# ------------------------------------------------------------------------------------------------ CP


def test_cp_rank_above_what_the_tensor_needs_reconstructs_it():
    """Rank 5 of a 2 x 2 x 2 tensor (ALS's 5 x 5 systems have rank <= 4) and ranks 5, 10 of a tensor of rank 1 plus
    rounding noise (a 2SR tensor learned with huge kernel widths) stopped with 'Singular matrix'."""
    from pipeline.decompose import cp_decompose

    rng = np.random.default_rng(0)
    small = rng.standard_normal((2, 2, 2))
    f = cp_decompose(small, 5, seed=0)
    assert (f.A.shape, f.B.shape, f.C.shape) == ((5, 2), (5, 2), (5, 2))
    assert f.relative_error < 1e-9 and np.linalg.norm(f.reconstruct() - small) / np.linalg.norm(small) < 1e-9
    u, v, w = rng.standard_normal(5), rng.standard_normal(4), rng.standard_normal(5)
    near_rank_1 = np.einsum("i,j,k->ijk", u, v, w) + 1e-20 * rng.standard_normal((5, 4, 5))
    for rank in (5, 10):
        f = cp_decompose(near_rank_1, rank, seed=0)
        assert f.A.shape == (rank, 5) and np.isfinite(f.A).all() and f.relative_error < 1e-6


def test_cp_of_a_tensor_that_cannot_be_decomposed_names_rank_shape_and_remedy():
    from pipeline.decompose import cp_decompose

    W = np.ones((3, 2, 3))
    W[1, 0, 2] = np.nan
    with pytest.raises(ValueError) as err:
        cp_decompose(W, 4)
    assert str(err.value) == ("CP rank 4 of a tensor of shape (3, 2, 3): 1 of its 18 entries are NaN or Inf; expected "
                              "a finite tensor (check the 2SR that made it: kernel widths, ridge)")
    with pytest.raises(ValueError) as err:
        cp_decompose(np.zeros((2, 2, 2)), 5)
    assert str(err.value) == ("CP rank 5 of a tensor of shape (2, 2, 2): the tensor is all zero; expected a non-zero "
                              "tensor (check the 2SR that made it: kernel widths, ridge)")
    huge = np.full((2, 3, 2), 1e300)   # finite, but its norm overflows: decomposed all the same
    assert cp_decompose(huge, 1).relative_error < 1e-12


def test_decompose_stage_names_dataset_seed_variants_and_tensor(tmp_path, monkeypatch, defaults):
    import copy

    from pipeline.config import parse_params
    from pipeline.workflow import spectral

    raw = copy.deepcopy(defaults)
    raw["hmm"]["variants"] = ["psrnn", "factorized_psrnn_r5", "factorized_psrnn_r5_random"]
    params = parse_params(raw)
    monkeypatch.setattr(spectral, "load_two_stage",
                        lambda root, dataset, seed, depth, dp=None: SimpleNamespace(layers=[SimpleNamespace(
                            W=np.zeros((10, 6, 10)))]))
    with pytest.raises(ValueError) as err:
        spectral.decompose(params, tmp_path, "hmm", 1)
    assert str(err.value) == (
        "decompose hmm seed 1: CP rank 5 of a tensor of shape (10, 6, 10): the tensor is all zero; expected a "
        "non-zero tensor (check the 2SR that made it: kernel widths, ridge) (the layer-1 2SR tensor "
        f"{tmp_path / 'artifacts' / 'hmm' / 's1' / '2sr' / 'L1.npz'}, for factorized_psrnn_r5)")


def test_decompose_stage_of_a_2x2x2_tensor_at_rank_5(tmp_path, defaults):
    """The audit's case: two_stage {state_dim: 2, obs_dim: 2, past_dim: 2} with factorized_psrnn_r5, run through
    the real features, two_stage and decompose stages."""
    import copy

    from pipeline.config import parse_params
    from pipeline.io import load_npz
    from pipeline.workflow.data import prepare
    from pipeline.workflow.spectral import decompose, features, two_stage

    raw = copy.deepcopy(defaults)
    raw["hmm"]["source"].update(n_train=10, n_test=4, length=40)
    raw["hmm"]["two_stage"] = {"n_features": 64, "state_dim": 2, "obs_dim": 2, "past_dim": 2, "past_window": 2,
                               "future_window": 2}
    raw["hmm"]["variants"] = ["psrnn", "factorized_psrnn_r5"]
    params = parse_params(raw)
    prepare(params, tmp_path, "hmm")
    features(params, tmp_path, "hmm", 0)
    two_stage(params, tmp_path, "hmm", 0)
    out = decompose(params, tmp_path, "hmm", 0)
    arrays, meta = load_npz(out / "r5.npz")
    assert arrays["A"].shape == (5, 2) and meta["relative_error"] < 1e-6


# ------------------------------------------------------------------------------------------------ outputs


def _tree(root: Path) -> Path:
    (root / "params.yaml").write_text("seeds: [0]\n")
    ckpt = root / "models" / "hmm" / "psrnn" / "s0" / "checkpoint.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"model")
    (root / "data" / "prepared").mkdir(parents=True)
    (root / "data" / "prepared" / "hmm.parquet").write_bytes(b"dataset")
    return ckpt


def test_outputs_among_the_projects_own_files_are_refused(tmp_path, monkeypatch):
    from pipeline.inference import check_output_path

    root = tmp_path / "project"
    root.mkdir()
    _tree(root)
    folders = ("data/raw/, data/prepared/, artifacts/, models/, metrics/, plots/, predictions/, reports/, mlruns/, "
               ".dvc/, .git/")
    files = "params.yaml, dvc.yaml, dvc.lock, mlflow.db"
    for rel, owned in (("models/hmm/psrnn/s0/checkpoint.pt", "inside the models/ folder"),
                       ("data/prepared/hmm.parquet", "inside the data/prepared/ folder"),
                       ("data/raw/ptb/ptb.train.txt", "inside the data/raw/ folder"),
                       ("artifacts/hmm/s0/new.parquet", "inside the artifacts/ folder"),
                       ("predictions/x.parquet", "inside the predictions/ folder"),
                       ("params.yaml", "the params.yaml"), ("mlflow.db", "the mlflow.db"),
                       ("data/../models/x.parquet", "inside the models/ folder")):
        out = root / rel
        with pytest.raises(ValueError) as err:
            check_output_path(out, root)
        assert str(err.value) == (f"{out}: the output is {owned} of the project {root.resolve()}, which the "
                                  f"pipeline writes or reads; expected a path outside its folders {folders} and "
                                  f"other than {files}")
    # through a link to a folder of the project, and from the project around the working directory (no root given)
    (tmp_path / "alias").symlink_to(root / "models")
    with pytest.raises(ValueError, match="the output is inside the models/ folder of the project"):
        check_output_path(tmp_path / "alias" / "x.parquet", root)
    monkeypatch.chdir(root)
    with pytest.raises(ValueError, match=r"^models/hmm/psrnn/s0/checkpoint\.pt: the output is inside the models/"):
        check_output_path("models/hmm/psrnn/s0/checkpoint.pt")
    # anywhere else is fine: the project root itself, a folder of one's own, outside the project
    for ok in ("out.parquet", "mine/out.parquet", "models.parquet", "data/preds.parquet", "data/rawish/x.parquet",
               str(tmp_path / "out.parquet")):
        check_output_path(ok, root)



def test_outputs_in_the_mlflow_store_of_the_environment_are_refused(tmp_path, monkeypatch):
    """The store MLFLOW_TRACKING_URI names, outside any project, is the runs of every stage: a predict output there
    replaced the SQLite database with a Parquet file (only a warning about the suffix), and the next stage failed
    on "not a SQLite database"."""
    from pipeline.inference import check_output_path

    store = tmp_path / "store"
    store.mkdir()
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{store / 'runs.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for out, where in ((store / "runs.db", ""), ("store/runs.db", ""), (store / "mlruns" / "1" / "x.parquet", "inside ")):
        with pytest.raises(ValueError) as err:
            check_output_path(out)
        assert str(err.value) == (f"{out}: the output is {where}the MLflow store of MLFLOW_TRACKING_URI={uri}, which "
                                  "holds the pipeline's runs; expected a path outside it")
    (tmp_path / "link").symlink_to(store)   # through a link to its folder
    with pytest.raises(ValueError, match="the output is the MLflow store"):
        check_output_path(tmp_path / "link" / "runs.db")
    for ok in (store / "runs.parquet", tmp_path / "mlruns" / "x.parquet", store / "other.db"):
        check_output_path(ok)
    for uri in (f"file://{store}", str(store)):   # a file store: its folder
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        with pytest.raises(ValueError, match="^" + re.escape(f"{store / '0' / 'x.parquet'}: the output is inside the "
                                                             f"MLflow store of MLFLOW_TRACKING_URI={uri}")):
            check_output_path(store / "0" / "x.parquet")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")   # a server: nothing here is its
    check_output_path(store / "runs.db")


# ------------------------------------------------------------------------------------------------ mirror


def test_a_mirror_that_is_missing_or_a_file_is_named_when_the_download_fails(tmp_path, caplog):
    """Offline, with a mistyped mirror: the error named only the failed download, never the mirror."""
    from pipeline.data.download import DownloadError, RawFile, fetch

    (tmp_path / "passwd").write_text("root:x:0:0\n")
    (tmp_path / "real" / "ptb").mkdir(parents=True)
    f = RawFile("ptb.train.txt", "http://127.0.0.1:9/ptb.train.txt", "0" * 64)   # nothing listens on port 9
    for mirror, why in ((tmp_path / "nonexistent" / "mirror" / "ptb",
                         f"{tmp_path / 'nonexistent' / 'mirror' / 'ptb'} does not exist (there is no "
                         f"{tmp_path / 'nonexistent'})"),
                        (tmp_path / "passwd" / "ptb", f"{tmp_path / 'passwd' / 'ptb'}: {tmp_path / 'passwd'} is a "
                                                      "file, not a directory"),
                        (tmp_path / "passwd", f"{tmp_path / 'passwd'} is not a directory"),
                        (tmp_path / "real" / "ptb", f"{tmp_path / 'real' / 'ptb' / 'ptb.train.txt'} does not exist")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="pipeline.data.download"), pytest.raises(DownloadError) as err:
            fetch([f], tmp_path / "dest", mirror, retries=0)
        msg = str(err.value)
        assert msg.startswith("ptb.train.txt: download from http://127.0.0.1:9/ptb.train.txt failed after 1 "
                              "attempts: ") and msg.endswith(f"; not in the mirror either: {why}"), msg
        assert "\n" not in msg
        warned = [r.getMessage() for r in caplog.records]
        if mirror.name == "ptb" and mirror.parent.name == "real":   # a mirror folder without the file: no warning
            assert warned == []
        else:   # said at once, before the download is tried
            assert warned == [f"{tmp_path / 'dest'}: the mirror cannot be used: {why}; fetching from the upstream "
                              "URLs"]
        assert not (tmp_path / "dest" / "ptb.train.txt").exists()


# ------------------------------------------------------------------------------------------------ MLflow


@pytest.mark.parametrize("uri, problem", [
    ("sqlite:///", "an in-memory SQLite database, whose runs vanish when the process ends; expected "
                   "sqlite:///<path of the database file>, e.g. sqlite:///mlflow.db"),
    ("sqlite://", "an in-memory SQLite database, whose runs vanish when the process ends; expected "
                  "sqlite:///<path of the database file>, e.g. sqlite:///mlflow.db"),
    ("sqlite:///:memory:", "an in-memory SQLite database, whose runs vanish when the process ends; expected "
                           "sqlite:///<path of the database file>, e.g. sqlite:///mlflow.db"),
    ("sqlite:/mlflow.db", "not a SQLite URI MLflow can open; expected sqlite:///<path of the database file>"),
    ("http//localhost:5000", "looks like a mistyped URL (http// instead of http://); expected http://localhost:5000"),
    ("https//mlflow.example.org", "looks like a mistyped URL (https// instead of https://); expected "
                                  "https://mlflow.example.org"),
    ("http:/localhost:5000", "looks like a mistyped URL (http:/ instead of http://); expected http://localhost:5000"),
    ("localhost:5000", "looks like a server address without its scheme; expected http://localhost:5000"),
])
def test_tracking_uris_that_cannot_hold_runs_are_refused(monkeypatch, uri, problem):
    from pipeline.tracking import TrackingError, check_tracking_uri

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(TrackingError) as err:
        check_tracking_uri(uri)
    assert str(err.value) == f"MLFLOW_TRACKING_URI={uri}: {problem}"


def test_tracking_uris_that_can_hold_runs_pass(tmp_path, monkeypatch):
    from pipeline.tracking import check_tracking_uri, uri_problem

    monkeypatch.chdir(tmp_path)
    for uri in (f"sqlite:///{tmp_path / 'mlflow.db'}", "sqlite:///mlflow.db", "sqlite:///mlflow.db?timeout=20",
                "mlruns", str(tmp_path / "mlruns"), f"file://{tmp_path / 'mlruns'}", "http://localhost:5000",
                "databricks"):
        assert uri_problem(uri) is None, uri
    check_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")   # MLflow's opt-in to its deprecated file store
    check_tracking_uri("mlruns")


def test_stores_mlflow_would_refuse_once_training_is_set_up_are_refused_first(tmp_path, monkeypatch):
    """A file that is no SQLite database at the store's path, and MLflow's file store without its opt-in, failed
    only when the run was about to be logged, in MLflow's own multi-line exception."""
    from pipeline.tracking import TrackingError, check_tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    garbage = tmp_path / "mlflow.db"
    garbage.write_text("garbage\n")
    with pytest.raises(TrackingError, match=r": .*mlflow\.db is not a SQLite database \(another file at that path\?\); "
                                            r"expected an MLflow SQLite store, or a new path$"):
        check_tracking_uri(f"sqlite:///{garbage}")
    (tmp_path / "folder.db").mkdir()
    with pytest.raises(TrackingError, match=r"folder\.db is a directory; expected the path of a SQLite database"):
        check_tracking_uri(f"sqlite:///{tmp_path / 'folder.db'}")
    garbage.write_bytes(b"")                       # empty: SQLite makes a database of it
    check_tracking_uri(f"sqlite:///{garbage}")
    from mlflow import MlflowClient

    real = tmp_path / "real.db"
    MlflowClient(f"sqlite:///{real}").search_experiments()   # a real store
    check_tracking_uri(f"sqlite:///{real}")
    check_tracking_uri("databricks")   # a scheme alone (Databricks' default profile), not a folder of the file store
    for uri in ("mlruns", f"file://{tmp_path / 'mlruns'}"):
        with pytest.raises(TrackingError, match=r"a path, which MLflow reads as a folder of its file store, and which "
                                                r"it refuses .*; expected sqlite:///<path>/mlflow\.db .*, or "
                                                r"MLFLOW_ALLOW_FILE_STORE=true$"):
            check_tracking_uri(uri)


@pytest.mark.parametrize("run_id", ["", "../x", None, " 0123456789abcdef0123456789abcdef", "a/b", 12])
def test_load_mlflow_run_refuses_what_is_not_a_run_id(run_id):
    from pipeline.inference import load_mlflow_run

    with pytest.raises(ValueError) as err:
        load_mlflow_run(run_id)
    assert str(err.value) == (f"run_id={run_id!r}: expected an MLflow run id (32 hexadecimal digits, as the MLflow "
                              "UI shows it, e.g. 0123456789abcdef0123456789abcdef)")


def test_load_mlflow_run_refuses_an_in_memory_store(monkeypatch):
    from pipeline.inference import load_mlflow_run

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///")
    with pytest.raises(ValueError) as err:
        load_mlflow_run("0123456789abcdef0123456789abcdef")
    assert str(err.value) == ("sqlite:/// (MLFLOW_TRACKING_URI): an in-memory SQLite database, whose runs vanish "
                              "when the process ends; expected sqlite:///<path of the database file>, e.g. "
                              "sqlite:///mlflow.db")
    with pytest.raises(ValueError, match=r"^http//h:5000 \(tracking_uri\): looks like a mistyped URL"):
        load_mlflow_run("0123456789abcdef0123456789abcdef", tracking_uri="http//h:5000")
