"""Connected groups (union-find), for regions and islands of a graph."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


class UnionFind(Generic[T]):
    """Items joined into groups; :meth:`groups` lists them in the order they are given."""

    def __init__(self, items: Iterable[T] = ()) -> None:
        self._parent: dict[T, T] = {}
        for item in items:
            self.add(item)

    def add(self, item: T) -> None:
        self._parent.setdefault(item, item)

    def __contains__(self, item: object) -> bool:
        return item in self._parent

    def find(self, item: T) -> T:
        parent = self._parent
        while parent[item] is not item:
            parent[item] = parent[parent[item]]  # path halving
            item = parent[item]
        return item

    def union(self, a: T, b: T) -> None:
        self.add(a)
        self.add(b)
        self._parent[self.find(a)] = self.find(b)

    def groups(self, items: Iterable[T]) -> list[list[T]]:
        """``items`` grouped by the group they are in, groups in the order of their first item."""
        found: dict[T, list[T]] = {}
        for item in items:
            found.setdefault(self.find(item), []).append(item)
        return list(found.values())
