"""One name -> class registry, for transforms (``transform = "fp16"``) and tasks (``task = "lm"``).

A registry is filled by the package whose classes it holds: importing
``onnxsmith.transforms`` registers every transform, ``onnxsmith.tasks`` every task.
Whoever looks a name up imports that package first (its ``get_*`` functions do).
"""

from __future__ import annotations

from typing import ClassVar, Generic, Protocol, TypeVar

from onnxsmith.core.errors import UsageError


class Named(Protocol):
    """What a registry holds: classes that say their name."""

    name: ClassVar[str]


T = TypeVar("T", bound=Named)


class Registry(Generic[T]):
    """Classes by their ``name`` attribute. ``kind`` is what an unknown name is called in errors and the
    recipe key that names one; ``help`` says what such a name stands for (the recipe reference shows it)."""

    def __init__(self, kind: str, help: str) -> None:
        self.kind = kind
        self.help = help
        self._classes: dict[str, type[T]] = {}

    def register(self, cls: type[T]) -> type[T]:
        """Class decorator: ``@REGISTRY.register``."""
        self._classes[cls.name] = cls
        return cls

    def classes(self) -> dict[str, type[T]]:
        return dict(self._classes)

    def create(self, name: str, *, called: str | None = None) -> T:
        """An instance of the class registered as ``name``; UsageError naming the known ones otherwise (an unknown
        name is called ``called``, where the user wrote another word for the kind: a recipe's deprecated ``pass``)."""
        if name not in self._classes:
            known = ", ".join(sorted(self._classes))
            raise UsageError(f"unknown {called or self.kind} '{name}' (known: {known})")
        return self._classes[name]()
