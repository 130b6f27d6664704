"""The conftest of `./eqsat.sh jax-tests` (a pytest plugin): JAX's own tests, jax.jit replaced by eqsat.optimize.

Only the tests' calls are redirected; jax itself is untouched. Each collected test module gets a proxy of the
`jax` module whose `jit` is eqsat.optimize, and its own `jit` name (from `from jax import jit`) is rebound the
same way; everything else is jax's."""

import types
from typing import Any

import jax

import eqsat

_real_jit = jax.jit


def _optimize(fun: Any = None, /, **options: Any) -> Any:
    if fun is None:
        return lambda f: _optimize(f, **options)
    return eqsat.optimize(fun, **options)


class _Jax(types.ModuleType):
    """jax, with jit redirected; attributes are read through to the real module."""

    def __getattr__(self, name: str) -> Any:
        return getattr(jax, name)


def pytest_collection_modifyitems(items: list) -> None:
    proxy = _Jax("jax")
    proxy.jit = _optimize
    for module in {item.module for item in items if getattr(item, "module", None) is not None}:
        if getattr(module, "jax", None) is jax:
            module.jax = proxy
        if getattr(module, "jit", None) is _real_jit:
            module.jit = _optimize
