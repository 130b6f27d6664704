"""Plans kept: versioned JSON, saved and loaded (compare and diff: extract.changes; HTML and DOT: extract.html).

A saved plan keeps everything but the program's constants and opaque parameters, so a loaded plan can be compared,
diffed and drawn but not run (its `graph` is None, as `backends.lower` expects of loaded plans). Version 2 adds
where each node came from (name stacks, source lines, inputs' pytree paths) and the original nodes' predicted
times; version 1 files load with those empty.
"""

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from eqsat.capture.ir import Graph, Node, Opaque, Role, Shape, Variable, Where
from eqsat.extract.cost import Cost
from eqsat.extract.extractors import ExtractionReport
from eqsat.extract.plan import Plan, PlanNode
from eqsat.extract.views import original_graph
from eqsat.ops.table import OPS

FORMAT = "eqsat-plan"
VERSION = 4  # 4: the plan's `overflow_guard` named `overflow_watch`; 3: a node's `weight` and `param` named
# `parameter_only` and `parameter`
READABLE = (1, 2, 3, 4)  # versions load_plan reads: fields a version lacks take their defaults
_RENAMED_NODE = {
    "weight": "parameter_only",
    "param": "parameter",
}  # node fields of versions 1 and 2, by their names now
_RENAMED_PLAN = {"overflow_guard": "overflow_watch"}  # plan fields of versions 1 to 3, by their names now


class PlanFormatError(ValueError):
    """A file or dict that is not a plan this version of eqsat can read."""


@dataclass(frozen=True)
class SavedPrimitive:
    """Stands in for an opaque jax primitive of a loaded plan: only its name was saved."""

    name: str

    def bind(self, *args: Any, **params: Any) -> Any:
        raise RuntimeError(f"a plan loaded from disk cannot run: the parameters of {self.name!r} were not saved")


# ---------------------------------------------------------------------------------------------------- JSON


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as JSON-ready data: every compared field of Plan, plus the original program's nodes."""
    graph = original_graph(plan)
    return {
        "format": FORMAT,
        "version": VERSION,
        "plan": _fields_to_dict(plan, _PLAN_ENCODE),
        "original": None if graph is None else _graph_to_dict(graph),
    }


def plan_from_dict(data: dict[str, Any]) -> Plan:
    """The Plan plan_to_dict() described; its original program, if saved, is what original_graph() returns."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise PlanFormatError(f"not an eqsat plan: expected format {FORMAT!r}, found {found!r}")
    if data.get("version") not in READABLE:
        raise PlanFormatError(
            f"eqsat plan format version {data.get('version')!r} is not supported; this eqsat reads versions "
            + ", ".join(map(str, READABLE))
        )
    try:
        plan = _fields_from_dict(Plan, _renamed(data["plan"], data["version"]), _PLAN_DECODE)
        if data.get("original") is not None:
            plan.saved_original = _graph_from_dict(data["original"])
    except (AttributeError, KeyError, TypeError, ValueError) as error:  # AttributeError: an old plan's node not a dict
        raise PlanFormatError(f"malformed eqsat plan: {type(error).__name__}: {error}") from None
    return plan


def _renamed(plan: dict[str, Any], version: int) -> dict[str, Any]:
    """A plan of an older version with its fields, and its nodes' fields, as this version names them."""

    def renamed(fields: dict[str, Any], names: dict[str, str], renamed_in: int) -> dict[str, Any]:
        return {names.get(k, k): v for k, v in fields.items()} if version < renamed_in else fields

    return renamed(plan, _RENAMED_PLAN, 4) | {"nodes": [renamed(n, _RENAMED_NODE, 3) for n in plan["nodes"]]}


def save_plan(plan: Plan, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(_dumps(plan_to_dict(plan)) + "\n")
    return path


def _dumps(value: Any, indent: str = "") -> str:
    """JSON with one line per small object (a node, a cost), so saved plans read and diff well."""
    flat = json.dumps(value, allow_nan=False, ensure_ascii=False)
    if len(flat) + len(indent) <= 200 or not isinstance(value, dict | list) or not value:
        return flat
    inner = indent + " "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {_dumps(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    return "[\n" + ",\n".join(inner + _dumps(v, inner) for v in value) + "\n" + indent + "]"


def load_plan(path: str | Path) -> Plan:
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as error:
        raise PlanFormatError(f"{path}: not JSON ({error})") from None
    return plan_from_dict(data)


def _num(x: float) -> float | str:
    # strict JSON has no inf/nan; spell them as strings
    return x if isinstance(x, int) or math.isfinite(x) else str(x)


def _unnum(x: float | str) -> float:
    return float(x) if isinstance(x, str) else x


def _cost_to_dict(cost: Cost) -> dict[str, Any]:
    return {
        "seconds": _num(cost.seconds),
        "flops": _num(cost.flops),
        "bytes": _num(cost.bytes),
        "kernels": cost.kernels,
    }


def _cost_from_dict(d: dict[str, Any]) -> Cost:
    return Cost(_unnum(d["seconds"]), _unnum(d["flops"]), _unnum(d["bytes"]), d["kernels"])


def _attrs_to_list(op: str, attrs: tuple[Any, ...]) -> list[Any]:
    return OPS[op].attrs_to_json(attrs)  # written as their sorts say (a Shape as a list)


def _attrs_from_list(op: str, attrs: list[Any]) -> tuple[Any, ...]:
    return OPS[op].attrs_from_json(attrs)


def _shape_from(shape: list[int] | None) -> Shape | None:
    return None if shape is None else tuple(shape)


def _shape_to(shape: Shape | None) -> list[int] | None:
    return None if shape is None else list(shape)


# Field converters to and from JSON, by field name (a node's attributes by its op's sorts, added per node); a
# field not named here is a JSON scalar (str, number, bool, None) or a dict of them, so a new simple field of Plan
# or PlanNode is saved without touching this module.
_NODE_ENCODE: dict[str, Callable[[Any], Any]] = {
    "inputs": list,
    "shape": _shape_to,
    "cost": _cost_to_dict,
    "scopes": list,
    "sources": list,
}
_NODE_DECODE: dict[str, Callable[[Any], Any]] = {
    "inputs": tuple,
    "shape": _shape_from,
    "cost": _cost_from_dict,
    "scopes": tuple,
    "sources": tuple,
}
_PLAN_ENCODE: dict[str, Callable[[Any], Any]] = {
    "nodes": lambda nodes: [_fields_to_dict(n, _NODE_ENCODE | {"attrs": partial(_attrs_to_list, n.op)}) for n in nodes],
    "outputs": list,
    "effects": list,
    "predicted": _cost_to_dict,
    "original": _cost_to_dict,
    "stats": lambda stats: {k: _num(v) for k, v in stats.items()},
    "rules_fired": dict,
    "original_seconds": lambda seconds: [_num(s) for s in seconds],
    "extraction": lambda report: {k: _num(v) if isinstance(v, float) else v for k, v in asdict(report).items()},
}
_PLAN_DECODE: dict[str, Callable[[Any], Any]] = {
    "nodes": lambda nodes: [
        _fields_from_dict(PlanNode, n, _NODE_DECODE | {"attrs": partial(_attrs_from_list, n["op"])}) for n in nodes
    ],
    "predicted": _cost_from_dict,
    "original": _cost_from_dict,
    "stats": lambda stats: {k: _unnum(v) for k, v in stats.items()},
    "original_seconds": lambda seconds: [_unnum(s) for s in seconds],
    # files before the report was typed kept only the fields that were set
    "extraction": lambda d: ExtractionReport(
        **{"method": "none", **{k: _unnum(v) if k.endswith("_cost") else v for k, v in d.items()}}
    ),
}


def _fields_to_dict(obj: Any, encode: dict[str, Callable[[Any], Any]]) -> dict[str, Any]:
    """The dataclass's compared fields (Plan.graph is not one), each through its converter."""
    return {f.name: encode.get(f.name, _plain)(getattr(obj, f.name)) for f in fields(obj) if f.compare}


def _fields_from_dict(cls: type, data: dict[str, Any], decode: dict[str, Callable[[Any], Any]]) -> Any:
    # fields missing from an older file take their defaults
    return cls(**{name: decode[name](value) if name in decode else value for name, value in data.items()})


def _plain(value: Any) -> Any:
    if isinstance(value, str | int | float | bool | dict | type(None)):
        return value
    if isinstance(value, np.generic):  # a numpy scalar among a primitive's parameters (an axis as np.int64)
        return value.item()
    if isinstance(value, list):  # e.g. Plan.autotune's candidates: a list of plain dicts
        return [_plain(v) for v in value]
    raise TypeError(f"cannot save {value!r} of type {type(value).__name__} as JSON")


def _graph_to_dict(graph: Graph) -> dict[str, Any]:
    nodes = [
        {
            "op": n.op,
            "name": graph.op_name(n.op, n.attrs),  # for people reading the file; loading ignores it
            "inputs": list(n.inputs),
            "attrs": _attrs_to_list(n.op, n.attrs),
            "shape": None if n.shape is None else list(n.shape),
            "dtype": n.dtype,
            **({"scope": where.scope, "source": where.source} if (where := graph.where.get(i)) else {}),
        }
        for i, n in enumerate(graph.nodes)
    ]
    return {
        "nodes": nodes,
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "effects": list(graph.effects),
        "consts": sorted(graph.consts),  # names only: the values stay out of the file
        "opaque": [{"primitive": o.primitive.name, "multiple_results": o.multiple_results} for o in graph.opaque],
        "variables": {name: [v.role.value, v.path] for name, v in graph.variables.items()},
    }


def _graph_from_dict(d: dict[str, Any]) -> Graph:
    return Graph(
        nodes=[
            Node(
                n["op"],
                tuple(n["inputs"]),
                _attrs_from_list(n["op"], n["attrs"]),
                _shape_from(n["shape"]),
                n.get("dtype"),
            )
            for n in d["nodes"]
        ],
        inputs=list(d["inputs"]),
        outputs=list(d["outputs"]),
        effects=list(d["effects"]),
        opaque=[Opaque(SavedPrimitive(o["primitive"]), {}, o["multiple_results"]) for o in d["opaque"]],
        where={i: Where(n["scope"], n["source"]) for i, n in enumerate(d["nodes"]) if "scope" in n},
        variables=_variables_from(d),
    )


def _variables_from(d: dict[str, Any]) -> dict[str, Variable]:
    """Each Var's role and path; files before roles kept paths and parameter names apart (constants: "c...")."""
    if "variables" in d:
        return {name: Variable(Role(role), path) for name, (role, path) in d["variables"].items()}
    paths, params = d.get("input_paths", {}), set(d.get("params", ()))
    variables = {name: Variable(Role.PARAMETER if name in params else Role.ARGUMENT, p) for name, p in paths.items()}
    return variables | {name: Variable(Role.CONSTANT) for name in d.get("consts", ())}
