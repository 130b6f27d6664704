"""A mapping that keeps its `size` most recently used entries: the signature cache's bound."""

from collections import OrderedDict
from collections.abc import Hashable, Iterator, MutableMapping
from typing import Any


class LRU(MutableMapping):
    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[Hashable, Any] = OrderedDict()

    def __getitem__(self, key: Hashable) -> Any:
        value = self._items[key]
        self._items.move_to_end(key)
        return value

    def __setitem__(self, key: Hashable, value: Any) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def __delitem__(self, key: Hashable) -> None:
        del self._items[key]

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[Hashable]:
        return iter(list(self._items))  # a snapshot: another thread may add an entry meanwhile

    def values(self) -> list[Any]:  # type: ignore[override]
        """The values, least recently used first; looking at them does not make them recent."""
        return list(self._items.values())

    def items(self) -> list[tuple[Hashable, Any]]:  # type: ignore[override]
        return list(self._items.items())

    def __len__(self) -> int:
        return len(self._items)
