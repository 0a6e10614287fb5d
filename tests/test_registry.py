import pytest

from mtgrpo._registry import Registry


def test_registry_lookup_alias_and_case():
    reg = Registry[int]("colour")
    reg.add("red", 1, aliases=("rouge",))
    assert reg.get("red") == 1
    assert reg.get("ROUGE") == 1
    assert reg.canonical("rouge") == "red"
    assert "rouge" in reg
    assert "blue" not in reg
    assert list(reg) == ["red"]


def test_registry_refuses_duplicates_and_lists_names_on_miss():
    reg = Registry[int]("colour")
    reg.add("red", 1, aliases=("rouge",))
    with pytest.raises(ValueError, match="'red' is already registered"):
        reg.add("red", 2)
    with pytest.raises(ValueError, match="'rouge' is already registered"):
        reg.add("crimson", 3, aliases=("rouge",))
    expected = r"unknown colour 'blu'; valid names: red; aliases: rouge \(= red\)"
    with pytest.raises(ValueError, match=expected):
        reg.get("blu")
