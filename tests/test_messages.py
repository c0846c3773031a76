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
