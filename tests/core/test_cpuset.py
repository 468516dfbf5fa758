import pytest
from hypothesis import given, strategies as st

from perfbalance.cpuset import CpuSet
from perfbalance.errors import ParseError


@pytest.mark.parametrize("text,ids,canon", [
    ("", set(), ""), ("0", {0}, "0"), ("0-3,8", {0, 1, 2, 3, 8}, "0-3,8"),
    (" 5,1-2\n", {1, 2, 5}, "1-2,5"), ("3,2,1", {1, 2, 3}, "1-3"),
])
def test_parse_and_print_kernel_list(text, ids, canon):
    s = CpuSet.parse(text)
    assert set(s) == ids and str(s) == canon


@pytest.mark.parametrize("bad", ["a", "3-1", "-1", "1-", "1,,x", "99999999"])
def test_bad_list_names_the_value(bad):
    with pytest.raises(ParseError) as e:
        CpuSet.parse(bad, source="cpuset.cpus")
    assert repr(bad) in str(e.value) and "cpuset.cpus" in str(e.value)


def test_mask_format():
    assert str(CpuSet.parse_mask("ff,00000001")) == "0,32-39"
    assert CpuSet.parse("0,32-39").mask() == 0xFF00000001


@given(st.frozensets(st.integers(0, 300)))
def test_roundtrip(ids):
    s = CpuSet(ids)
    assert CpuSet.parse(str(s)) == s
    assert CpuSet.parse_mask(hex(s.mask())) == s
