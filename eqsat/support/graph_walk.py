"""Walks over any DAG given by its roots and a children function: the program graph, the plan, a choice of
e-nodes. One implementation for every layer that needs one."""

from collections.abc import Callable, Hashable, Iterable


def reachable[K: Hashable](roots: Iterable[K], children: Callable[[K], Iterable[K]]) -> set[K]:
    """Every node reached from the roots, the roots included."""
    seen: set[K] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(children(node))
    return seen


def postorder[K: Hashable](roots: Iterable[K], children: Callable[[K], Iterable[K]]) -> list[K]:
    """The nodes reached from the roots, each after its children, visited depth first from the left (roots and
    children in the order given); ValueError if the walk finds a cycle."""
    order: list[K] = []
    finished: dict[K, bool] = {}  # False while on the current path, True once finished
    stack: list[tuple[K, bool]] = [(root, False) for root in reversed(list(roots))]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            finished[node] = True
            order.append(node)
            continue
        if node in finished:
            if not finished[node]:
                raise ValueError(f"the graph is cyclic through {node}")
            continue
        finished[node] = False
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(list(children(node))) if not finished.get(c, False))
    return order
