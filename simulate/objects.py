"""``nl.NKIObject``: the base class of kernel helper classes and configuration objects.

NKI requires user classes inside kernels to derive from it. ``NKIObject(**kwargs)`` sets each
keyword as an attribute. Subclasses decorated with ``@dataclass`` may also be given their plain,
un-annotated class attributes as keyword arguments (real helper modules do this): such attributes
are turned into fields with the class value as default when the subclass is created.
"""

from __future__ import annotations

import typing

from .errors import SubsetError

_NOT_FIELDS = (staticmethod, classmethod, property, type)


class NKIObject:
    """Base class for NKI kernel dataclasses and configuration objects."""

    def __init__(self, **kwargs: typing.Any) -> None:
        for key, value in kwargs.items():
            setattr(self, key, value)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        others = [b.__name__ for b in cls.__bases__ if not issubclass(b, NKIObject)]
        if others:
            raise SubsetError(f"class {cls.__name__} derives from {', '.join(others)}: NKI "
                              f"classes derive from NKIObject and no other class",
                              op="NKIObject", operand=cls.__name__)
        annotations = cls.__dict__.get("__annotations__", {})
        plain = {name: value for name, value in cls.__dict__.items()
                 if not name.startswith("__") and name not in annotations
                 and not callable(value) and not isinstance(value, _NOT_FIELDS)
                 and not isinstance(value, (list, dict, set))}   # dataclass refuses mutable defaults
        if plain:
            cls.__annotations__ = {**annotations, **{name: typing.Any for name in plain}}
