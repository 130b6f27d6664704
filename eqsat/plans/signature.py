"""A call's signature, as jax.jit keys its traces, and what it says about each flat input.

`signature_of` splits a call into its dynamic leaves and the Signature they and the static arguments make;
`inputs_of` gives each flat leaf its role (argument or parameter) and pytree path once, and that tuple travels
with the leaves from here to lowering (capture tags the graph's Vars with it; prepare orders leaves by it).
"""

import inspect
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax._src import (
    api_util,  # jax.jit's debug info: how its errors name the function and arguments
    config,  # trace_context(): what jax.jit keys its traces by besides the arguments
)
from jax.core import ShapedArray

from eqsat.capture.ir import Role, Variable
from eqsat.numerics.sample import example_like
from eqsat.plans.sharding import explicit_sharding


class Signature(NamedTuple):
    """What a plan is keyed by, as jax.jit keys its traces: the dynamic leaves' tree and abstract values, the
    static arguments by position or name, type and value (so 1, True and 1.0 get plans of their own), and the
    trace context: the enclosing transformations' axis sizes, the configuration that changes tracing (x64, rank
    promotion, default matmul precision, ...), user contexts and the abstract mesh."""

    n_args: int
    tree: Any  # of (dynamic positional arguments, dynamic keyword arguments)
    avals: tuple[Any, ...]
    statics: tuple[tuple[int | str, type, Any], ...]
    context: tuple  # jax's config.trace_context() where the call was made


def signature_of(
    args: tuple, kwargs: dict[str, Any], static_argnums: tuple[int, ...], static_argnames: tuple[str, ...]
) -> tuple[list[Any], Signature]:
    """The dynamic leaves and the signature they and the static arguments make; static_argnums beyond the
    arguments passed are ignored, as jax.jit ignores them."""
    n = len(args)
    static = {i % n for i in static_argnums if -n <= i < n}
    statics = tuple((i, type(args[i]), args[i]) for i in sorted(static))
    statics += tuple((k, type(v), v) for k, v in sorted(kwargs.items()) if k in static_argnames)
    dynamic = (
        [a for i, a in enumerate(args) if i not in static],
        {k: v for k, v in kwargs.items() if k not in static_argnames},
    )
    flat, tree = jax.tree_util.tree_flatten(dynamic)
    return flat, Signature(n, tree, tuple(abstract(x) for x in flat), statics, config.trace_context())


def threads_share(signature: Signature) -> bool:
    """Whether another thread traces under the signature's context: no context manager of the calling thread
    (jax.enable_x64, a vmap's axis name, a user context) changes it. Only then can the planning thread build,
    validate and compile its plan as the call would."""
    found: list[tuple] = []
    thread = threading.Thread(target=lambda: found.append(config.trace_context()), name="eqsat-context")
    thread.start()
    thread.join()
    return found == [signature.context]


def inputs_of(fun: Callable[..., Any], signature: Signature, params_argnums: tuple[int, ...]) -> tuple[Variable, ...]:
    """Each flat leaf's role (a leaf of a parameter argument, or an argument) and its pytree path in the call."""
    positions = dynamic_positions(signature)
    paths = input_paths(fun, signature.tree, signature.avals, positions)
    args, _ = stand_ins(signature.tree, signature.avals)
    params = {i % signature.n_args for i in params_argnums} if signature.n_args else set()
    # the flat leaves are the positional arguments' in order, then the keyword arguments'
    roles = [
        Role.PARAMETER if pos in params else Role.ARGUMENT
        for pos, sub in zip(positions, args, strict=True)
        for _ in jax.tree_util.tree_leaves(sub)
    ]
    roles += [Role.ARGUMENT] * (len(paths) - len(roles))
    return tuple(Variable(role, path) for role, path in zip(roles, paths, strict=True))


def dynamic_positions(signature: Signature) -> list[int]:
    """The call's positions of the positional arguments in the signature's tree (static ones are not)."""
    static = {k for k, _, _ in signature.statics if isinstance(k, int)}
    return [i for i in range(signature.n_args) if i not in static]


def flat_function(fun: Callable[..., Any], signature: Signature) -> tuple[Callable[..., list[Any]], Callable[[], Any]]:
    """fun as a function of the flat dynamic leaves, and its output tree. Only the static values are closed over
    (never an argument, which would keep it alive and, under a trace, leak it)."""
    static = {k: v for k, _, v in signature.statics}
    out_tree: dict[str, Any] = {}
    try:  # the plans, shared and weakly keyed by fun, must not keep it alive
        ref = weakref.ref(fun)
    except TypeError:
        ref = lambda: fun  # noqa: E731

    def flat_fun(*leaves: Any) -> list[Any]:
        args, kwargs = _call_of(signature, static, leaves)
        results, out_tree["tree"] = jax.tree_util.tree_flatten(ref()(*args, **kwargs))
        return results

    api_util.save_wrapped_fun_debug_info(flat_fun, _debug_info(fun, signature, static))
    return flat_fun, lambda: out_tree["tree"]


def _debug_info(fun: Callable[..., Any], signature: Signature, static: dict[int | str, Any]) -> Any:
    """jax.jit's debug info for the call: an error while tracing names the user's function and argument (x,
    params['w']) as jax.jit's does, not flat_fun and its leaves."""
    args, kwargs = _call_of(signature, static, signature.avals)
    names = tuple(k for k in static if isinstance(k, str))
    numbers = tuple(k for k in static if isinstance(k, int))
    return api_util.debug_info("jit", fun, args, kwargs, static_argnums=numbers, static_argnames=names)


def _call_of(signature: Signature, static: dict[int | str, Any], leaves: Sequence[Any]) -> tuple[list, dict[str, Any]]:
    """The call's positional and keyword arguments, from its dynamic leaves and its static values."""
    args, kwargs = jax.tree_util.tree_unflatten(signature.tree, leaves)
    dynamic = iter(args)
    full = [static[i] if i in static else next(dynamic) for i in range(signature.n_args)]
    return full, {**kwargs, **{k: v for k, v in static.items() if isinstance(k, str)}}


def abstract(x: Any) -> Any:
    """The abstract value jax.jit keys a leaf by (shape, dtype, weak type; a token's own type; the sharding over a
    mesh of explicit axes, which is part of the type there), without the varying-axes annotations a trace adds."""
    aval = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
    if not hasattr(aval, "shape") or not hasattr(aval, "dtype"):
        return aval
    weak_type = bool(getattr(aval, "weak_type", False))
    sharding = explicit_sharding(aval)
    if sharding is not None:
        return ShapedArray(tuple(aval.shape), aval.dtype, weak_type=weak_type, sharding=sharding)
    return ShapedArray(tuple(aval.shape), aval.dtype, weak_type=weak_type)


def examples(signature: Signature) -> list[Any]:
    """Examples of the signature's leaves, placed as their type says where it names an explicit sharding."""
    found = [example_like(aval, i) for i, aval in enumerate(signature.avals)]
    return [
        x if explicit_sharding(aval) is None else jax.device_put(x, explicit_sharding(aval).spec)
        for x, aval in zip(found, signature.avals, strict=True)
    ]


def concrete(leaves: Sequence[Any]) -> bool:
    """Values, not tracers: what a plan can be compared on."""
    values = all(isinstance(x, jax.Array | np.ndarray | np.generic | int | float | complex) for x in leaves)
    return values and not any(isinstance(x, jax.core.Tracer) for x in leaves)


def aval_key(x: Any) -> tuple:
    """Shape and dtype of an argument leaf, cheaply for arrays (this runs on every prepared call)."""
    if isinstance(x, jax.Array | np.ndarray):
        return x.shape, x.dtype
    return np.shape(x), jax.numpy.result_type(x)


def merge_params(positions: tuple[int, ...], params: tuple, rest: tuple) -> tuple:
    """The full argument tuple with the parameters at their positions and the rest in order around them."""
    n = len(params) + len(rest)
    given = {p % n: v for p, v in zip(positions, params, strict=True)}
    others = iter(rest)
    return tuple(given[i] if i in given else next(others) for i in range(n))


def stand_ins(tree: Any, avals: Sequence[Any]) -> Any:
    """The call's tree rebuilt from stand-ins of its leaves, of their shapes and dtypes: a pytree class may look at
    its leaves as it is built, as jax.jit's tracers let it (integers in their place made planning give up)."""
    leaves = [jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "shape") else a for a in avals]
    return jax.tree_util.tree_unflatten(tree, leaves)


def input_paths(fun: Callable[..., Any], tree: Any, avals: Sequence[Any], positions: Sequence[int]) -> list[str]:
    """Each flat argument's place in the call as a person writes it, e.g. params.layers[0].wq.

    tree: the flat arguments' tree of (dynamic positional arguments, keyword arguments), avals: its leaves'
    abstract values; positions: each dynamic positional argument's index in the call (static ones are left out of
    the tree)."""
    try:
        names = [
            p.name
            for p in inspect.signature(fun).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):  # a builtin or a callable without a signature
        names = []
    paths = []
    for (group, head, *rest), _ in jax.tree_util.tree_flatten_with_path(stand_ins(tree, avals))[0]:
        if group.idx == 0:
            position = positions[head.idx]
            name = names[position] if position < len(names) else f"args[{position}]"
        else:
            name = str(head.key)
        paths.append(name + "".join(map(_key_text, rest)))
    return paths


def _key_text(key: Any) -> str:
    if isinstance(key, jax.tree_util.DictKey):
        return f".{key.key}" if isinstance(key.key, str) and key.key.isidentifier() else f"[{key.key!r}]"
    if isinstance(key, jax.tree_util.GetAttrKey):
        return f".{key.name}"
    if isinstance(key, jax.tree_util.SequenceKey):
        return f"[{key.idx}]"
    if isinstance(key, jax.tree_util.FlattenedIndexKey):  # a child of a custom pytree node
        return f"[{key.key}]"
    return str(key)
