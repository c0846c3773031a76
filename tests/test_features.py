import numpy as np
import pytest

from pipeline.features import (
    RandomFourierFeatures,
    fit_feature_maps,
    make_windows,
    median_pairwise_distance,
    one_hot_window_distance_sample,
)


def test_windows_never_mix_trajectories():
    rng = np.random.default_rng(0)
    small = rng.uniform(0.0, 1.0, size=(30, 2))          # values in [0, 1)
    large = rng.uniform(1000.0, 1001.0, size=(25, 2))    # values in [1000, 1001)
    w = make_windows([small, large], past=3, future=4, discrete=False)
    assert len(w) == (30 - 3 - 4) + (25 - 3 - 4)
    for arr in (w.past, w.future, w.shifted, w.obs):
        row_is_small = (arr < 1.0).all(axis=1)
        row_is_large = (arr >= 1000.0).all(axis=1)
        assert np.all(row_is_small ^ row_is_large), "a window spans both trajectories"
    # times are (trajectory, t) and the windows are exactly the slices they name
    for (i, t), p, f, s, o in zip(w.times, w.past, w.future, w.shifted, w.obs):
        traj = [small, large][i]
        np.testing.assert_array_equal(p, traj[t - 3:t].ravel())
        np.testing.assert_array_equal(f, traj[t:t + 4].ravel())
        np.testing.assert_array_equal(s, traj[t + 1:t + 5].ravel())
        np.testing.assert_array_equal(o, traj[t])


def test_discrete_windows_are_one_hot_indices():
    traj = np.array([0, 1, 2, 0, 1, 2, 2])
    w = make_windows([traj], past=2, future=2, discrete=True, vocab_size=3)
    # position j of a window occupies columns j*V ... j*V+V-1
    np.testing.assert_array_equal(w.past[0], [0, 3 + 1])
    np.testing.assert_array_equal(w.future[0], [2, 3 + 0])
    np.testing.assert_array_equal(w.shifted[0], [0, 3 + 1])
    np.testing.assert_array_equal(w.obs[:, 0], traj[2:5])


def test_too_short_trajectories_are_an_error():
    with pytest.raises(ValueError, match="long enough"):
        make_windows([np.zeros((4, 1))], past=2, future=2, discrete=False)


def test_rff_approximates_gaussian_kernel():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((50, 3))
    sigma = 1.7
    rff = RandomFourierFeatures.create(3, 20000, sigma, seed=0)
    z = rff.transform(x)
    approx = z @ z.T
    d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    exact = np.exp(-d2 / (2 * sigma ** 2))
    assert np.abs(approx - exact).max() < 0.05


def test_rff_is_reproducible_by_seed_and_indices_match_dense_one_hot():
    a = RandomFourierFeatures.create(12, 64, 1.0, seed=3)
    b = RandomFourierFeatures.create(12, 64, 1.0, seed=3)
    c = RandomFourierFeatures.create(12, 64, 1.0, seed=4)
    np.testing.assert_array_equal(a.frequencies, b.frequencies)
    assert not np.allclose(a.frequencies, c.frequencies)
    idx = np.array([[1, 4 + 2, 8 + 3], [0, 4 + 0, 8 + 1]])
    dense = np.zeros((2, 12))
    dense[np.arange(2)[:, None], idx] = 1.0
    np.testing.assert_allclose(a.transform_indices(idx), a.transform(dense), atol=1e-12)


def test_median_width():
    x = np.array([[0.0], [1.0], [3.0]])  # distances 1, 2, 3 -> median 2
    assert median_pairwise_distance(x) == pytest.approx(2.0)
    # one-hot windows: sqrt(2) per differing position
    w = np.array([[0, 3], [0, 4], [1, 5]])  # pairwise differing positions 1, 2, 2
    assert one_hot_window_distance_sample(w, 3) == pytest.approx(2.0)


@pytest.mark.parametrize("offset", [0.0, 1e6, 1e7])
def test_median_width_is_exact_far_from_the_origin(offset):
    """The width of data far from zero (unstandardised, through the API) is that of the same data at zero: the
    expanded ‖x‖² + ‖y‖² − 2xᵀy lost it to cancellation (16x too wide at an offset of 1e7)."""
    from scipy.spatial.distance import pdist

    x = np.random.default_rng(0).normal(scale=1e-2, size=(300, 3))
    expected = float(np.median(pdist(x)))
    assert median_pairwise_distance(x + offset) == pytest.approx(expected, rel=1e-6)


def test_feature_maps_use_median_widths_unless_given():
    rng = np.random.default_rng(0)
    traj = rng.standard_normal((200, 2))
    w = make_windows([traj], past=2, future=3, discrete=False)
    maps = fit_feature_maps(w, n_features=16, obs_dim=2, seed=0)
    assert maps.obs.width == pytest.approx(median_pairwise_distance(w.obs, seed=0))
    scaled = fit_feature_maps(w, n_features=16, obs_dim=2, width_scale=2.0, seed=0)   # every median width, scaled
    for name in ("obs", "past", "future"):
        assert getattr(scaled, name).width == pytest.approx(2.0 * getattr(maps, name).width, rel=1e-12)
    fixed = fit_feature_maps(w, n_features=16, obs_dim=2, widths={"obs": 0.5}, seed=0)
    assert fixed.obs.width == 0.5
    assert fixed.past.input_dim == 4 and fixed.future.input_dim == 6


def test_every_random_source_of_every_seed_draws_its_own_stream():
    """The maps of seed s+1000 were seed s's (the past map of one, the future map of the other) when each family's
    seed was seed + 1000(k+1): sweeps over seeds 0, 1000, 2000 had correlated initialisations. Now no map of
    seeds 0, 1, 1000, 2000 equals or contains another's, and the upper layers' seeds differ from every run seed."""
    from pipeline.features import layer_seed

    traj = np.random.default_rng(0).standard_normal((300, 2))
    w = make_windows([traj], past=2, future=2, discrete=False)   # past and future maps of the same shape
    seeds = (0, 1, 1000, 2000)
    omegas = []
    for s in seeds:
        maps = fit_feature_maps(w, n_features=32, obs_dim=2, widths={"obs": 1.0, "past": 1.0, "future": 1.0}, seed=s)
        omegas += [maps.obs.frequencies, maps.past.frequencies, maps.future.frequencies]
    for i, a in enumerate(omegas):
        for b in omegas[i + 1:]:
            assert not np.isin(a.ravel(), b.ravel()).any()
    again = fit_feature_maps(w, n_features=32, obs_dim=2, widths={"obs": 1.0, "past": 1.0, "future": 1.0}, seed=1000)
    np.testing.assert_array_equal(again.past.frequencies, omegas[2 * 3 + 1])     # and each is reproducible
    uppers = {layer_seed(s, level) for s in seeds for level in (1, 2)}
    assert len(uppers) == 8 and not uppers & set(seeds) and all(0 <= u < 2 ** 32 for u in uppers)


def test_the_median_subsample_and_the_range_finder_draw_from_their_own_streams():
    """The median width of a family is taken on the subsample drawn from seed_sequence(seed, MEDIAN_SAMPLE, k) (it
    was seed + 7k: seed 7's obs subsample was seed 0's past one); the range finder's stream is none of the others;
    every stream of seeds 0, 1, 7, 17, 101, 1000 (the old offsets' collisions) is distinct; a seed that is no
    integer in [0, 2**32) is refused (an entropy list took 2**33 + a as two words, colliding with other streams)."""
    from pipeline.features import MEDIAN_SAMPLE, RANGE_FINDER, RFF_MAP, seed_sequence

    traj = np.random.default_rng(1).standard_normal((400, 2))
    w = make_windows([traj], past=2, future=2, discrete=False)
    for seed in (0, 7):
        maps = fit_feature_maps(w, n_features=8, obs_dim=2, seed=seed, max_points=50)
        for k, name in enumerate(("obs", "past", "future")):
            rows = np.sort(np.random.default_rng(seed_sequence(seed, MEDIAN_SAMPLE, k)).choice(len(w), 50,
                                                                                               replace=False))
            assert getattr(maps, name).width == median_pairwise_distance(w.rows(name, rows), max_points=50)
    states = [tuple(seed_sequence(s, src, k).generate_state(4)) for s in (0, 1, 7, 17, 101, 1000)
              for src in (MEDIAN_SAMPLE, RFF_MAP, RANGE_FINDER) for k in range(3)]
    assert len(set(states)) == len(states)
    for bad in (-1, 2 ** 32, 2 ** 33 + 5, 1.7, True, "3"):
        with pytest.raises(ValueError, match=r"expected an integer with 0 <= seed < 2\*\*32"):
            seed_sequence(bad, RFF_MAP)
