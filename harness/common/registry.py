"""A small name → class registry, used instead of if/else chains on kinds.

Example::

    class Reader: ...
    readers: Registry[type[Reader]] = Registry("trace format")

    @readers.register("mooncake")
    class MooncakeReader(Reader): ...

    readers.get("mooncake")  # -> MooncakeReader; unknown names raise ConfigError listing the known ones
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from harness.common.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Names mapped to registered objects, in registration order."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers its target under ``name`` (names are unique)."""

        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        """The object registered as ``name``; a :class:`ConfigError` naming the choices otherwise."""
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(self._items) or "none"
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def names(self) -> list[str]:
        return list(self._items)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(self._items.items())

    def __contains__(self, name: object) -> bool:
        return name in self._items
