"""A registry: the one list of the components of one kind (policies, servers, endpoint
pickers) by name. CLI choices, settings validation and the tests read it, so a component
registered once is offered, validated and tested everywhere; a name is never silently
taken twice, and an unknown one is one InputError naming the choices."""

from __future__ import annotations

import contextlib

from vtc_jax.core.errors import InputError


class Registry:
    """Components of `kind` (a word for messages: "policy"), each an instance of
    `component` with a `name`; `shown` names that type in the refusal of anything else."""

    def __init__(self, kind: str, component: type, shown: str):
        self.kind, self._component, self._shown = kind, component, shown
        self._items: dict = {}

    def register(self, item, *, replace: bool = False):
        """Add `item` (its name must be new unless `replace`); returns it."""
        if not isinstance(item, self._component):
            raise InputError(f"expected a {self._shown}, got {type(item).__name__}")
        if item.name in self._items and not replace and self._items[item.name] is not item:
            raise InputError(f"a {self.kind} named {item.name!r} is already registered")
        self._items[item.name] = item
        return item

    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        return tuple(self._items)

    def get(self, name: str):
        """The component called `name` (InputError naming the choices otherwise)."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise InputError(f"unknown {self.kind} {name!r}; choose one of {', '.join(self._items)}") from None

    def registered(self, name: str):
        """The component registered as `name`, None if none is."""
        return self._items.get(name)

    @contextlib.contextmanager
    def provisionally(self, item):
        """`item` registered under its (new) name inside the with block only."""
        if item.name in self._items:
            raise InputError(f"a {self.kind} named {item.name!r} is already registered")
        self._items[item.name] = item
        try:
            yield item
        finally:
            del self._items[item.name]

    def snapshot(self) -> dict:
        """A copy of the name -> component map (a test that registers restores it)."""
        return dict(self._items)
