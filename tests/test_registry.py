"""The one registry shape behind contrast rules and gates: register, look up, refuse duplicates, list in order."""

import pytest

from fides_rag.registry import Registry


class First:
    pass


class Second:
    pass


def test_registered_classes_are_found_by_name_in_registration_order():
    registry: Registry[type] = Registry("widget")
    registry.register("b")(First)
    registry.register("a")(Second)
    assert registry.names() == ["b", "a"]
    assert registry.get("a") is Second and First.name == "b"  # type: ignore[attr-defined]
    assert "b" in registry and "c" not in registry and registry.find("c") is None


def test_an_unknown_name_is_refused_naming_the_available_ones():
    registry: Registry[type] = Registry("widget")
    registry.register("one")(First)
    with pytest.raises(ValueError, match=r"unknown widget 'two'; available widgets: one"):
        registry.get("two")


def test_a_second_class_under_a_taken_name_is_refused_and_the_same_class_again_is_not():
    registry: Registry[type] = Registry("widget")
    registry.register("one")(First)
    registry.register("one")(First)
    with pytest.raises(ValueError, match=r"a widget named 'one' is already registered \(First\)"):
        registry.register("one")(Second)


def test_unregistering_forgets_a_name():
    registry: Registry[type] = Registry("widget")
    registry.register("one")(First)
    registry.unregister("one")
    assert registry.names() == []
    with pytest.raises(ValueError, match="unknown widget"):
        registry.unregister("one")
