"""Tests for pipeline.data.mocap: ASF/AMC parsing, forward kinematics and the 300-frame track split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import MIRROR
from pipeline.data import mocap
from pipeline.data.mocap import (
    DEFAULT_TRIALS,
    MocapFileError,
    bone_starts,
    forward_kinematics,
    load_trial,
    parse_amc,
    parse_asf,
    prepare_mocap,
)

RAW = MIRROR / "mocap"
FRAMES = {"07_01": 316, "07_02": 329, "07_09": 306, "07_10": 301, "07_11": 315, "16_15": 471, "35_01": 358}


@pytest.fixture(scope="module")
def raw() -> Path:
    if not (RAW / "cmu").is_dir():
        pytest.skip(f"mocap mirror not found at {RAW}")
    return RAW


@pytest.fixture(scope="module")
def trial_35(raw):
    sk = parse_asf(raw / "cmu" / "35" / "35.asf")
    frames = parse_amc(raw / "cmu" / "35" / "35_01.amc")
    pos, names = forward_kinematics(sk, frames)
    return sk, frames, pos, names


@pytest.fixture(scope="module")
def default_ds(raw):
    return prepare_mocap(raw)


# ----------------------------------------------------------------------------------------------- parsing


def test_frame_counts_all_frames_kept(raw):
    assert set(FRAMES) == set(DEFAULT_TRIALS)
    for trial, n in FRAMES.items():
        subject = trial.split("_")[0]
        frames = parse_amc(raw / "cmu" / subject / f"{trial}.amc")
        assert len(frames) == n, trial
        assert len(frames[-1]) == 29 and sum(v.size for v in frames[-1].values()) == 62


def test_asf_parse(raw):
    sk = parse_asf(raw / "cmu" / "35" / "35.asf")  # CRLF file
    sk07 = parse_asf(raw / "cmu" / "07" / "07.asf")  # LF file
    for s in (sk, sk07):
        assert len(s.bones) == 30
        assert s.length_unit == 0.45 and s.angle_unit == "deg"
        assert s.root_order == ("tx", "ty", "tz", "rx", "ry", "rz")
        assert s.bone_names[0] == "root"
    b = sk.bones["lfemur"]
    assert b.dof == ("rx", "ry", "rz") and b.axis_order == "XYZ"
    np.testing.assert_allclose(np.rad2deg(b.axis), [0, 0, 20])
    assert b.limits == [(-160.0, 20.0), (-70.0, 70.0), (-60.0, 70.0)]
    assert sk.parent["lfemur"] == "lhipjoint" and sk.parent["lhipjoint"] == "root"
    assert sk.parent["lclavicle"] == "thorax"
    assert sk.bones["lhipjoint"].dof == ()


def test_first_frame_values(raw):
    f0 = parse_amc(raw / "cmu" / "35" / "35_01.amc")[0]
    np.testing.assert_array_equal(f0["root"], [4.40047, 17.8934, -21.0986, -0.943965, -8.37963, -7.42612])
    np.testing.assert_array_equal(f0["rradius"], [31.043])


def test_crlf_and_lf_parse_identically(tmp_path, raw):
    src = raw / "cmu" / "35"
    for name in ("35.asf", "35_01.amc"):
        text = (src / name).read_bytes().replace(b"\r\n", b"\n")
        assert b"\r" not in text
        (tmp_path / name).write_bytes(text)
    a = forward_kinematics(parse_asf(src / "35.asf"), parse_amc(src / "35_01.amc"))[0]
    b = forward_kinematics(parse_asf(tmp_path / "35.asf"), parse_amc(tmp_path / "35_01.amc"))[0]
    np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------------------- forward kinematics


def test_fk_shapes_and_root(trial_35):
    sk, frames, pos, names = trial_35
    assert pos.shape == (358, 31, 3)
    assert names[0] == "root" and names[1:] == list(sk.bones)
    translation = np.array([f["root"][:3] for f in frames])
    np.testing.assert_allclose(pos[:, 0], translation / 0.45, rtol=0, atol=1e-12)


def test_fk_bone_lengths_constant(trial_35):
    sk, _, pos, names = trial_35
    lengths = np.linalg.norm(pos - bone_starts(sk, pos, names), axis=-1)
    expected = np.array([0.0] + [sk.bones[n].length / 0.45 for n in names[1:]])
    np.testing.assert_allclose(lengths, np.broadcast_to(expected, lengths.shape), rtol=0, atol=1e-9)


def test_fk_feet_on_the_ground(trial_35):
    _, _, pos, names = trial_35
    y = pos[..., 1]
    ground = y.min()
    lowest = names[int(np.argmin(y.min(axis=0)))]
    assert lowest in ("ltoes", "rtoes", "lfoot", "rfoot")
    assert -2.0 < ground < 2.0  # CMU floor is y = 0 (inches)
    feet = [names.index(b) for b in ("ltoes", "rtoes", "lfoot", "rfoot")]
    # walking: in every frame some foot is within a few inches of the floor...
    assert np.all(y[:, feet].min(axis=1) - ground < 3.0)
    # ...and the head is far above it (about 5-6 ft)
    head = y[:, names.index("head")] - ground
    assert 55 < head.min() and head.max() < 80


def test_fk_matches_bvh_conversion(raw):
    """Independent check against the third-party BVH conversion of 16_15 (cm, same joints).

    Joints on the trunk (root, spine, neck, head, clavicles, shoulder and hip joints) must agree to < 0.01 cm on
    every frame: these depend on the root's rotation order and the spine's dof convention. Limb joints are only
    checked loosely (median < 1 cm): the conversion itself distorts them in a few frames (see PROVENANCE.md).
    """
    bvh_path = raw / "cmu" / "16" / "16_15.converted.bvh"
    if not bvh_path.is_file():
        pytest.skip(f"{bvh_path} not found")
    joints, data = _parse_bvh(bvh_path)
    bvh_pos, bvh_names = _bvh_fk(joints, data)
    pos, names, sk = load_trial(raw, "16_15")
    assert bvh_pos.shape[0] == pos.shape[0] == 471
    start_cm, end_cm = bone_starts(sk, pos, names) * 2.54, pos * 2.54
    trunk = {"root", "lowerback", "upperback", "thorax", "lowerneck", "upperneck", "head", "head_end", "lclavicle",
             "rclavicle", "lhumerus", "rhumerus", "lfemur", "rfemur"}  # fmt: skip
    checked = 0
    for k, name in enumerate(bvh_names):
        if name == "root":
            ours = end_cm[:, 0]
        elif name.endswith("_end"):
            ours = end_cm[:, names.index(name[:-4])]
        else:
            ours = start_cm[:, names.index(name)]  # a BVH joint sits at the start of the ASF bone of that name
        err = np.linalg.norm(bvh_pos[:, k] - ours, axis=-1)
        if name in trunk:
            assert err.max() < 0.01, (name, err.max())
        else:
            assert np.median(err) < 1.0, (name, np.median(err))
        checked += 1
    assert checked >= 30


def _parse_bvh(path: Path) -> tuple[list[dict], np.ndarray]:
    """Minimal BVH reader: joints (name, parent index, offset, channels) and the (frames, channels) motion array."""
    toks = path.read_text().split()
    i, joints, stack = 0, [], []
    while toks[i] != "MOTION":
        t = toks[i]
        if t in ("ROOT", "JOINT"):
            joints.append({"name": toks[i + 1], "parent": stack[-1] if stack else -1, "channels": []})
            i += 2
        elif t == "End":
            joints.append({"name": joints[stack[-1]]["name"] + "_end", "parent": stack[-1], "channels": []})
            i += 2
        elif t == "{":
            stack.append(len(joints) - 1)
            i += 1
        elif t == "}":
            stack.pop()
            i += 1
        elif t == "OFFSET":
            joints[stack[-1]]["offset"] = np.array([float(v) for v in toks[i + 1 : i + 4]])
            i += 4
        elif t == "CHANNELS":
            n = int(toks[i + 1])
            joints[stack[-1]]["channels"] = toks[i + 2 : i + 2 + n]
            i += 2 + n
        else:
            i += 1
    assert toks[i + 1] == "Frames:" and toks[i + 3 : i + 5] == ["Frame", "Time:"]
    n_frames = int(toks[i + 2])
    n_ch = sum(len(j["channels"]) for j in joints)
    values = np.array([float(v) for v in toks[i + 6 :]])
    assert values.size == n_frames * n_ch
    return joints, values.reshape(n_frames, n_ch)


def _bvh_fk(joints: list[dict], data: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Standard BVH FK: local rotation = channel rotations in listed order; joint = parent + G_parent·offset."""
    T, col = data.shape[0], 0
    G, P = [], []
    for j in joints:
        R = np.broadcast_to(np.eye(3), (T, 3, 3))
        trans = {}
        for ch in j["channels"]:
            v = data[:, col]
            col += 1
            if ch.endswith("position"):
                trans[ch[0].lower()] = v
            else:
                R = R @ mocap._axis_rotation(ch[0].lower(), np.deg2rad(v))
        if j["parent"] < 0:
            p, g = np.stack([trans[c] for c in "xyz"], axis=-1), R  # root channels are absolute positions
        else:
            gp = G[j["parent"]]
            p, g = P[j["parent"]] + gp @ j["offset"], gp @ R
        G.append(g)
        P.append(p)
    return np.stack(P, axis=1), [j["name"] for j in joints]


# ------------------------------------------------------------------------------------------------ malformed


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_malformed_asf_names_file_and_line(tmp_path, raw):
    good = (raw / "cmu" / "35" / "35.asf").read_text().splitlines()
    lines = list(good)
    k = next(i for i, line in enumerate(lines) if line.strip().startswith("direction"))
    lines[k] = "     direction 0.6 abc 0.1"
    bad = _write(tmp_path / "bad.asf", "\n".join(lines))
    with pytest.raises(MocapFileError, match=r"bad\.asf:\d+: bone lhipjoint direction"):
        parse_asf(bad)
    lines = [line for line in good if "lhipjoint lfemur" not in line]  # lfemur loses its parent
    with pytest.raises(MocapFileError, match=r"orphan\.asf: bones missing from ':hierarchy': \['lfemur'\]"):
        parse_asf(_write(tmp_path / "orphan.asf", "\n".join(lines)))
    with pytest.raises(FileNotFoundError, match="nope.asf"):
        parse_asf(tmp_path / "nope.asf")


def test_malformed_amc_names_file_and_line(tmp_path, raw):
    lines = (raw / "cmu" / "35" / "35_01.amc").read_text().splitlines()[:63]  # header + 2 frames
    assert lines[3] == "1"
    bad = list(lines)
    bad[5] = "lowerback 11.505 x 4.40928"
    with pytest.raises(MocapFileError, match=r"bad\.amc:6: bone 'lowerback'"):
        parse_amc(_write(tmp_path / "bad.amc", "\n".join(bad)))
    skip = list(lines)
    skip[33] = "3"  # frame 2 renumbered 3
    with pytest.raises(MocapFileError, match=r"skip\.amc:34: frame 3 follows frame 1"):
        parse_amc(_write(tmp_path / "skip.amc", "\n".join(skip)))
    sk = parse_asf(raw / "cmu" / "35" / "35.asf")
    frames = parse_amc(_write(tmp_path / "ok.amc", "\n".join(lines)))
    del frames[1]["ltibia"]
    with pytest.raises(MocapFileError, match=r"frame index 1: bone 'ltibia' is missing"):
        forward_kinematics(sk, frames)
    frames = parse_amc(tmp_path / "ok.amc")
    frames[0]["rradius"] = np.zeros(2)
    with pytest.raises(MocapFileError, match=r"'rradius' has 2 values, expected 1"):
        forward_kinematics(sk, frames)


# ---------------------------------------------------------------------------------------------- prepare_mocap


def test_prepare_default_shapes(default_ds):
    ds = default_ds
    assert ds.kind == "continuous"
    assert len(ds.train) == 40 and len(ds.test) == 8
    m = len(ds.features)
    assert m == 3 * len(mocap.DEFAULT_BONES) and "thorax_x" in ds.features and "lclavicle_z" in ds.features
    assert all(t.shape == (300, m) for t in ds.train + ds.test)
    assert all(np.isfinite(t).all() for t in ds.train + ds.test)
    json.dumps(ds.meta)  # must be storable in the Parquet metadata


def test_prepare_split_by_trial(default_ds):
    meta = default_ds.meta
    train_trials, test_trials = set(meta["train_trials"]), set(meta["test_trials"])
    assert train_trials.isdisjoint(test_trials) and train_trials | test_trials == set(DEFAULT_TRIALS)
    # round(7 * 8 / 48) = 1 trial, plus more while they hold fewer than 8 distinct windows
    assert sum(FRAMES[t] - 299 for t in test_trials) >= 8
    assert {t.split("_")[0] for t in test_trials} <= {t.split("_")[0] for t in train_trials}
    assert len(meta["tracks"]["train"]) == 40 and len(meta["tracks"]["test"]) == 8
    assert {t for t, _ in meta["tracks"]["train"]} <= train_trials
    assert {t for t, _ in meta["tracks"]["test"]} <= test_trials
    assert {t for t, _ in meta["tracks"]["train"]} == train_trials  # every train trial is used
    for split in ("train", "test"):
        for trial, start in meta["tracks"][split]:
            assert 0 <= start <= FRAMES[trial] - 300
    assert meta["overlap"] == {"train": True, "test": True}  # the 7-trial mirror is too small (documented)


def test_prepare_tracks_match_fk(raw, default_ds):
    """A track is the FK output of its (trial, start) window, relative to the root, then standardised."""
    ds, meta = default_ds, default_ds.meta
    trial, start = meta["tracks"]["test"][0]
    pos, names, _ = load_trial(raw, trial)
    idx = [names.index(b) for b in meta["bones"]]
    rel = (pos[start : start + 300, idx] - pos[start : start + 300, :1]).reshape(300, -1)
    mean, std = (np.array(meta["normalization"][k]) for k in ("mean", "std"))
    np.testing.assert_allclose(ds.test[0] * std + mean, rel, atol=1e-9)


def test_prepare_normalisation(default_ds):
    x = np.concatenate(default_ds.train)
    np.testing.assert_allclose(x.mean(axis=0), 0, atol=1e-9)
    np.testing.assert_allclose(x.std(axis=0), 1, atol=1e-9)
    assert len(default_ds.meta["normalization"]["mean"]) == len(default_ds.features)


def test_prepare_deterministic_and_seeded(raw, default_ds):
    again = prepare_mocap(raw, seed=0)
    assert again.meta == default_ds.meta
    for a, b in zip(again.train + again.test, default_ds.train + default_ds.test):
        np.testing.assert_array_equal(a, b)
    chosen = {tuple(prepare_mocap(raw, seed=s).meta["test_trials"]) for s in range(1, 6)}
    assert len(chosen | {tuple(default_ds.meta["test_trials"])}) > 1


def test_prepare_disjoint_when_enough_frames(raw):
    ds = prepare_mocap(raw, n_train=6, n_test=1, test_trials=["35_01"], bones=["thorax", "head"])
    assert ds.meta["overlap"] == {"train": False, "test": False}
    assert ds.features == ["thorax_x", "thorax_y", "thorax_z", "head_x", "head_y", "head_z"]
    assert ds.meta["tracks"]["test"] == [["35_01", 29]]  # centred: (358 - 300) // 2
    windows = {}
    for trial, start in ds.meta["tracks"]["train"]:
        windows.setdefault(trial, []).append(start)
    for trial, starts in windows.items():
        assert all(b - a >= 300 for a, b in zip(starts, starts[1:])), (trial, starts)
    # 16_15 (471 frames) is the longest and gets a track first; with 6 tracks every train trial gets one
    assert sorted(windows) == sorted(set(DEFAULT_TRIALS) - {"35_01"})


# ------------------------------------------------------------------------------- tracks: no duplicates, metadata


def _assert_no_duplicates(ds) -> None:
    for split in ("train", "test"):
        where = [tuple(w) for w in ds.meta["tracks"][split]]
        assert len(set(where)) == len(where), (split, where)
        blobs = [t.tobytes() for t in ds.split(split)]
        assert len(set(blobs)) == len(blobs), split


def test_window_starts_are_distinct():
    assert mocap._window_starts(301, 2, 300) == [0, 1]
    assert mocap._window_starts(315, 6, 300) == [0, 3, 6, 9, 12, 15]
    assert mocap._window_starts(358, 1, 300) == [29]  # centred
    assert mocap._window_starts(300, 1, 300) == [0]
    with pytest.raises(ValueError, match="only 2 distinct windows"):
        mocap._window_starts(301, 4, 300)  # the old code returned [0, 0, 0, 1]


def test_allocate_disjoint_first_then_proportional_then_capped():
    assert mocap._allocate([600, 350], 3, 300) == [2, 1]  # disjoint windows are used before any overlap
    assert mocap._allocate([301, 315], 8, 300) == [2, 6]  # 07_10 holds only 2 distinct windows (old: [4, 4])
    assert mocap._allocate([301, 302], 8, 300) == [2, 3]  # all distinct windows: 5 tracks, not 8
    assert mocap._allocate([316, 329], 8, 300) == [4, 4]
    rng = np.random.default_rng(0)
    for _ in range(200):
        lengths = rng.integers(300, 700, size=int(rng.integers(1, 6))).tolist()
        n = int(rng.integers(1, 60))
        counts = mocap._allocate(lengths, n, 300)
        assert sum(counts) == min(n, sum(L - 299 for L in lengths))
        assert all(0 <= c <= L - 299 for c, L in zip(counts, lengths))
        for L, c in zip(lengths, counts):
            starts = mocap._window_starts(L, c, 300)
            assert len(set(starts)) == c and all(0 <= s <= L - 300 for s in starts)
        if n <= sum(L // 300 for L in lengths):  # enough room: every window disjoint
            assert all(c <= L // 300 for c, L in zip(counts, lengths))


def test_split_summary_counts():
    s = mocap._split_summary([["a", 0], ["a", 1], ["b", 10], ["b", 400]], 4, 300)
    assert s == {"n_requested": 4, "n_tracks": 4, "frames": 1200, "distinct_frames": 301 + 600,
                 "overlap": True, "min_start_gap": 1}
    s = mocap._split_summary([["a", 0], ["a", 300], ["b", 5]], 3, 300)
    assert s["overlap"] is False and s["distinct_frames"] == 900 and s["min_start_gap"] == 300
    assert mocap._split_summary([["a", 3]], 2, 300)["min_start_gap"] is None


def test_params_defaults_have_no_duplicate_tracks(raw):
    """params.yaml's split (test 07_10 + 07_11): the old code cut 07_10 (301 frames) at 0, 0, 0, 1."""
    ds = prepare_mocap(raw, test_trials=["07_10", "07_11"])
    _assert_no_duplicates(ds)
    assert len(ds.train) == 40 and len(ds.test) == 8
    assert ds.meta["tracks"]["test"] == [["07_10", 0], ["07_10", 1]] + [["07_11", s] for s in range(0, 16, 3)]
    assert ds.meta["splits"]["test"] == {"n_requested": 8, "n_tracks": 8, "frames": 2400,
                                         "distinct_frames": 301 + 315, "overlap": True, "min_start_gap": 1}
    train = ds.meta["splits"]["train"]
    assert (train["n_tracks"], train["distinct_frames"], train["overlap"]) == (40, 316 + 329 + 306 + 471 + 358, True)
    assert ds.meta["overlap"] == {"train": True, "test": True}


def test_recommended_test_trials(raw, caplog):
    """Holding out 07_01 + 07_02 gives 8 distinct test tracks at least 5 frames apart; every subject is in train."""
    with caplog.at_level("WARNING", logger="pipeline.data.mocap"):
        ds = prepare_mocap(raw, test_trials=["07_01", "07_02"])
    _assert_no_duplicates(ds)
    assert ds.meta["train_trials"] == ["07_09", "07_10", "07_11", "16_15", "35_01"]
    assert ds.meta["splits"]["test"] == {"n_requested": 8, "n_tracks": 8, "frames": 2400,
                                         "distinct_frames": 316 + 329, "overlap": True, "min_start_gap": 5}
    assert ds.meta["splits"]["train"]["n_tracks"] == 40
    assert not any("no trial in training" in r.getMessage() for r in caplog.records)


def test_too_few_distinct_windows_caps_the_count(raw, caplog):
    with caplog.at_level("WARNING", logger="pipeline.data.mocap"):
        ds = prepare_mocap(raw, trials=["07_10", "07_09"], test_trials=["07_10"], n_train=3, n_test=8,
                           bones=["thorax"])
    assert ds.meta["tracks"]["test"] == [["07_10", 0], ["07_10", 1]]  # 301 frames: 2 distinct windows
    assert len(ds.test) == 2 and ds.meta["splits"]["test"]["n_tracks"] == 2
    assert ds.meta["splits"]["test"]["n_requested"] == 8
    _assert_no_duplicates(ds)
    msgs = [r.getMessage() for r in caplog.records if "made 2 tracks" in r.getMessage()]
    assert len(msgs) == 1 and "\n" not in msgs[0] and "n_test=8" in msgs[0]


def test_tracks_are_their_windows(raw):
    """Every track (train and test) is exactly the standardised window its metadata names."""
    ds = prepare_mocap(raw, trials=["07_10", "07_11", "35_01"], test_trials=["07_10"], n_train=6, n_test=3,
                       bones=["thorax", "lfoot"])
    assert len(ds.test) == 2
    mean, std = (np.array(ds.meta["normalization"][k]) for k in ("mean", "std"))
    for split in ("train", "test"):
        for x, (trial, start) in zip(ds.split(split), ds.meta["tracks"][split]):
            pos, names, _ = load_trial(raw, trial)
            idx = [names.index(b) for b in ("thorax", "lfoot")]
            rel = (pos[start : start + 300, idx] - pos[start : start + 300, :1]).reshape(300, -1)
            np.testing.assert_allclose(x * std + mean, rel, atol=1e-9)


def test_default_test_trials_keep_every_subject_in_training():
    for seed in range(20):
        test = mocap._choose_test_trials(list(FRAMES), FRAMES, 40, 8, 300, seed)
        train = [t for t in FRAMES if t not in test]
        assert test and train
        assert {t.split("_")[0] for t in test} <= {t.split("_")[0] for t in train}, (seed, test)
        assert sum(FRAMES[t] - 299 for t in test) >= 8, (seed, test)
    single = {"16_15": 471, "35_01": 358}  # one trial per subject: a cross-subject test cannot be avoided
    assert len(mocap._choose_test_trials(list(single), single, 40, 8, 300, 0)) == 1


def test_check_split(caplog):
    mocap.check_split(["07_01", "07_02", "16_15"], ["07_02"])
    mocap.check_split(["07_01", "07_02"], None)
    with pytest.raises(ValueError, match="duplicate trials"):
        mocap.check_split(["07_01", "07_02", "07_09"], ["07_01", "07_01"])
    with pytest.raises(ValueError, match="'7-1'"):
        mocap.check_split(["07_01", "7-1"], None)
    with pytest.raises(ValueError, match="at least 2 trials"):
        mocap.check_split(["07_01"], None)
    with pytest.raises(ValueError, match="must hold at least one trial"):
        mocap.check_split(["07_01", "07_02"], [])
    with caplog.at_level("WARNING", logger="pipeline.data.mocap"):
        mocap.check_split(["07_01", "16_15"], ["16_15"])
    assert any("['16']" in r.getMessage() and "no trial in training" in r.getMessage() for r in caplog.records)


def test_params_validation_leaves_the_cross_subject_warning_to_preprocess(caplog):
    """Every stage validates params.yaml: the warning would be printed once per stage (48 times in the tiny
    end-to-end run); only prepare_mocap (the preprocess stage) says it."""
    import copy

    from pipeline.config import read_yaml

    from pipeline.config import parse_params

    raw = read_yaml((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    raw = copy.deepcopy(raw)
    raw["mocap"]["source"]["test_trials"] = ["35_01"]
    with caplog.at_level("WARNING", logger="pipeline.data.mocap"):
        parse_params(raw)
    assert not any("no trial in training" in r.getMessage() for r in caplog.records)


def test_prepare_errors(raw, tmp_path):
    with pytest.raises(ValueError, match=r"07_10\.amc: trial 07_10 has 301 frames, fewer than track_length=302"):
        prepare_mocap(raw, track_length=302)
    with pytest.raises(ValueError, match=r"cmu/07/07_99\.amc: file not found"):
        prepare_mocap(raw, trials=["07_01", "07_99"])
    with pytest.raises(FileNotFoundError, match=r"cmu/99/99\.asf"):
        prepare_mocap(raw, trials=["07_01", "99_01"])
    with pytest.raises(ValueError, match="not in trials"):
        prepare_mocap(raw, test_trials=["08_01"])
    with pytest.raises(ValueError, match="leave one for training"):
        prepare_mocap(raw, trials=["07_01", "07_02"], test_trials=["07_01", "07_02"])
    with pytest.raises(ValueError, match=r"^bones=\[.*\]: \['tail'\] are not in"):
        prepare_mocap(raw, bones=["thorax", "tail"])


def test_trial_errors_shorten_long_names_and_lists():
    """A 5,000-character trial name (a pasted file, a fuzzed params.yaml) is shown shortened, and a long list
    counted: the message stays one readable line with its 'expected' part."""
    from pipeline.data.mocap import check_split

    with pytest.raises(ValueError) as err:
        check_split(["07_01", "x" * 5000], None)
    msg = str(err.value)
    assert len(msg) < 200 and msg.endswith("expected '<subject>_<trial>' strings such as '07_01'"), msg
    with pytest.raises(ValueError) as err:
        check_split([f"07_{i:02d}" for i in range(30)], [f"9_{i}" for i in range(20)])
    msg = str(err.value)
    assert "... (20 in all)] are not in trials [" in msg and "... (30 in all)]" in msg and len(msg) < 400, msg
