import pytest

from mtgrpo.algo.registry import Registry


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


def test_a_declared_name_is_known_at_once_and_usable_once_registered():
    colours = Registry[int]("colour", provider="my.module")
    colours.declare("red", aliases=("rouge",))
    assert colours.canonical("rouge") == "red"
    assert "red" in colours
    assert colours.names() == ["red"]
    with pytest.raises(LookupError, match=r"colour 'red' is declared but its implementation is "
                                          r"not loaded yet \(import my.module\)"):
        colours.get("rouge")
    colours.add("red", 1, aliases=("rouge",))  # the declared aliases may be repeated
    assert colours.get("rouge") == 1
    with pytest.raises(ValueError, match="'red' is already registered"):
        colours.add("red", 2)
    colours.declare("blue")
    with pytest.raises(ValueError, match=r"declared without the aliases \['bleu'\]"):
        colours.add("blue", 3, aliases=("bleu",))


def test_every_declared_choice_is_implemented_by_its_provider():
    """mtgrpo.algo.registry names what the configuration accepts; each name must have its object
    once the module that implements it is imported (otherwise a valid config fails at run time)."""
    import importlib

    from mtgrpo.algo import registry as choices

    registries = [value for value in vars(choices).values() if isinstance(value, Registry)]
    assert len(registries) == 5
    for registry in registries:
        if registry.provider is not None:
            importlib.import_module(registry.provider)
        missing = [name for name in registry.names() if name in registry._declared]
        assert not missing, f"{registry.kind}: declared but not implemented: {missing}"
        for name in registry.names():
            assert registry.get(name) is not None
