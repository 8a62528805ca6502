"""A tool for examples/agent-tools/run.yaml: a unit converter the policy calls by name.

A tool is a plain Python function with type hints and a docstring: grouprl builds the JSON schema the
model is shown from them (the first docstring line is the description, the ``Args:`` lines describe
the parameters). Whatever it returns is sent back to the model as text; an exception it raises is sent
back as the error message, so a wrong unit teaches the model something instead of stopping the run.
"""

from __future__ import annotations

TO_BASE = {
    # length, in metres
    "mm": ("length", 0.001), "cm": ("length", 0.01), "m": ("length", 1.0), "km": ("length", 1000.0),
    "in": ("length", 0.0254), "ft": ("length", 0.3048), "yd": ("length", 0.9144), "mi": ("length", 1609.344),
    # mass, in kilograms
    "g": ("mass", 0.001), "kg": ("mass", 1.0), "oz": ("mass", 0.028349523125), "lb": ("mass", 0.45359237),
    # volume, in litres
    "ml": ("volume", 0.001), "l": ("volume", 1.0), "gal": ("volume", 3.785411784), "cup": ("volume", 0.2365882365),
}
"""Unit -> (dimension, its size in the dimension's base unit): exact definitions (an inch is 2.54 cm)."""


def convert_units(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a quantity from one unit to another of the same kind (length, mass or volume).

    Args:
        value: the quantity to convert, for example 12.5.
        from_unit: its unit: mm, cm, m, km, in, ft, yd, mi, g, kg, oz, lb, ml, l, gal or cup.
        to_unit: the unit wanted, from the same list and of the same kind.

    >>> convert_units(1, "mi", "km"), convert_units(2, "lb", "g")
    ('1.60934', '907.185')
    """
    units = {}
    for name in (from_unit, to_unit):
        key = name.strip().lower()
        if key not in TO_BASE:
            raise ValueError(f"unknown unit {name!r}; known units: {', '.join(TO_BASE)}")
        units[name] = TO_BASE[key]
    (kind_from, size_from), (kind_to, size_to) = units[from_unit], units[to_unit]
    if kind_from != kind_to:
        raise ValueError(f"cannot convert {kind_from} ({from_unit}) to {kind_to} ({to_unit})")
    return f"{float(value) * size_from / size_to:.6g}"
