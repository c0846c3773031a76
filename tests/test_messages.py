"""pipeline.messages: how one-line errors show the values they were given."""

from pipeline.messages import INT_SHOWN_BITS, brief, brief_list


def test_brief_cuts_long_values_and_keeps_short_ones():
    assert brief("abc") == "'abc'"
    assert brief(3.5) == "3.5"
    long = brief("x" * 500)
    assert long == "'" + "x" * 76 + "..." and len(long) == 80
    assert brief("x" * 500, 20) == "'" + "x" * 16 + "..."
    assert brief(list(range(1000)), 30) == repr(list(range(1000)))[:27] + "..."


def test_brief_describes_huge_integers_by_size():
    shown = 2 ** INT_SHOWN_BITS - 1            # the longest integer printed whole: 73 digits
    assert brief(shown) == str(shown) and len(str(shown)) == 73
    assert brief(2 ** INT_SHOWN_BITS) == "an integer of about 73 digits"
    assert brief(10 ** 5000) == "an integer of about 5001 digits"   # str() refuses past 4300 digits
    assert brief(-(10 ** 100)) == "an integer of about 101 digits"
    assert brief([1, 10 ** 5000]) == "[...]" and brief({"a": 10 ** 5000}) == "{...}"
    assert brief(True) == "True"


def test_brief_list_shows_the_first_values_and_the_count():
    assert brief_list([]) == ""
    assert brief_list(["a", "b"]) == "'a', 'b'"
    values = [f"trial_{i}" for i in range(25)]
    assert brief_list(values) == ", ".join(repr(v) for v in values[:10]) + ", ... (25 in all)"
    assert brief_list(values, most=2) == "'trial_0', 'trial_1', ... (25 in all)"
    assert brief_list(["y" * 100], each=10) == "'yyyyyy..."
    assert brief_list(iter([1, 2, 3])) == "1, 2, 3"


def test_an_option_with_a_huge_value_gets_its_own_message():
    """repr() of a 5000-digit integer raises Python's own ValueError ("Exceeds the limit (4300 digits)...")."""
    import pytest

    from pipeline.inference import check_seed

    with pytest.raises(ValueError, match=r"^seed=an integer of about 5001 digits: expected an integer with 0 <= seed"):
        check_seed(10 ** 5000)


def test_unlikely_measurements_judges_each_trajectory_on_its_own_rows():
    import numpy as np

    from pipeline.messages import unlikely_measurements

    lengths = [4, 3, 5]
    rng = np.random.default_rng(0)
    clock = np.concatenate([np.arange(n) + 10.0 * k for k, n in enumerate(lengths)])   # restarts each trajectory
    room = np.repeat([3.0, 7.0, 3.0], lengths)
    constant = np.full(sum(lengths), 2.0)                       # the same everywhere: no label
    noise = rng.normal(size=sum(lengths))
    climbs_across = np.sort(rng.normal(size=sum(lengths)))      # also increasing within each: a time too
    values = np.stack([noise, clock, room, constant, climbs_across], axis=1)
    assert unlikely_measurements(values, lengths) == [
        (1, "increases within every trajectory, like a time"), (2, "constant within each trajectory, like a label"),
        (4, "increases within every trajectory, like a time")]
    # one trajectory tells a time from a trend, and a label from a constant, by nothing: no warning
    assert unlikely_measurements(values[:4], [4]) == []
    # a trajectory of 2 rows does not count towards the two of 3 rows or more that a time needs
    assert unlikely_measurements(values[:6, 1:2], [4, 2]) == []
    # a step back inside one trajectory is no clock; a label that changes once inside one is none either
    broken = values.copy()
    broken[8, 1], broken[5, 2] = -1.0, 5.0
    assert unlikely_measurements(broken, lengths) == [(4, "increases within every trajectory, like a time")]
