"""Argument checks shared by the package, so that a bad value gets the same clear message everywhere."""

from __future__ import annotations


def positive_int(name: str, value, what: str = "") -> int:
    """Return ``value`` if it is an int ≥ 1 (not a bool), else raise ``ValueError`` naming ``name``,
    what it means (``what``) and the value that was given."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        meaning = f" ({what})" if what else ""
        raise ValueError(f"{name} must be a positive int{meaning}; got {value!r}")
    return value


def non_negative_int(name: str, value, what: str = "") -> int:
    """Return ``value`` if it is an int ≥ 0 (not a bool), else raise ``ValueError`` as :func:`positive_int`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        meaning = f" ({what})" if what else ""
        raise ValueError(f"{name} must be an int >= 0{meaning}; got {value!r}")
    return value
