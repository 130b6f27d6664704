"""Process 0's plan in every process of a multi-host job (eqsat/support/processes.py says why and how they exchange).

Process 0 plans (or loads, or refuses) as one process does, and shares the plan; the others measure their share of
the kernels it needs timed (extract/timing.py), then lower its plan on the program they captured, without planning.
Where any process cannot run it (another eqsat or jax version, a plan that does not lower there), every process
runs the original.
"""

import json
from dataclasses import astuple
from typing import TYPE_CHECKING, Any

import jax

from eqsat.extract.cost import keep_cache
from eqsat.extract.timing import TimingCache, Wanted, cache_for, local_device, measure
from eqsat.plans import plan_store
from eqsat.plans.plan_json import PlanFormatError, plan_from_dict, plan_to_dict
from eqsat.plans.plan_life import NewEntry
from eqsat.plans.signature import Signature
from eqsat.support import processes
from eqsat.support.errors import EqsatError

if TYPE_CHECKING:
    from eqsat.planning.planner import Captured, Planner


def agreed(planner: "Planner", signature: Signature, prepared: bool, captured: "Captured") -> NewEntry:
    """The signature's entry, the same in every process; it records the topic its processes agree under, for the
    checks that combine their verdicts (eqsat/checks/validate.py)."""
    profile = planner.options.target_profile
    topic = "plan/" + plan_store.program_key(captured.closed, (profile.name, prepared), portable=True)
    versions = f"eqsat {plan_store.code_version()}, jax {jax.__version__}"
    new: NewEntry | None = None
    problem = None
    if processes.leads():
        try:
            with processes.leading(topic):  # its kernel measurements are shared out (`measured_everywhere`)
                new = planner.build_here(signature, prepared, captured)
        except EqsatError as error:  # a bad rule or a shape conflict: raised in every process
            processes.share(topic, json.dumps({"error": str(error)}))
            raise
        plan = {**plan_to_dict(new.entry.plan), "original": None}  # the others captured the original themselves
        processes.share(topic, json.dumps({"plan": plan, "versions": versions}))
    else:
        shared = json.loads(processes.share(topic, None))
        while "measure" in shared:  # a share of the kernels process 0's plan needs timed, until the plan comes
            measure_share(shared, topic)
            shared = json.loads(processes.share(topic, None))
        if "error" in shared:
            raise EqsatError(shared["error"])
        new, problem = _adopted(planner, signature, prepared, captured, shared, versions)
    problems = processes.gather(f"{topic}/lowered", problem or "")
    if new is None or any(problems):
        i, why = next((i, p) for i, p in enumerate(problems) if p)
        new = planner.fallback_entry(signature, captured, f"process {i} cannot run process 0's plan ({why})")
    new.entry.agreement = topic
    return new


def _adopted(
    planner: "Planner",
    signature: Signature,
    prepared: bool,
    captured: "Captured",
    shared: dict[str, Any],
    versions: str,
) -> tuple[NewEntry | None, str | None]:
    """The entry of process 0's plan (`shared`) in this process, or what keeps it from running here. It is not
    stored: process 0 keeps the job's plans."""
    if shared["versions"] != versions:
        return None, f"made by {shared['versions']}, this process runs {versions}"
    try:
        plan = plan_from_dict(shared["plan"])
    except PlanFormatError as error:
        return None, str(error)
    call, problem = planner.lowered(plan, captured.closed, signature, captured.flat_fun)
    if problem is not None:
        return None, problem
    plan.stats.pop("stored", None)  # not this process's store
    return planner.adopted_entry(signature, prepared, captured, plan, call), None


def measured_everywhere(cache: TimingCache, missing: list[Wanted], seconds: float) -> dict[str, int]:
    """In process 0, while it plans: the kernels its plan needs timed (extract/timing.py `priced`), measured by
    every process, each a share (`measure_share`), where the cache lacks any; counts as `measure` gives them."""
    lacking, topic = [w for w in missing if w.key not in cache.entries], processes.led()
    if not lacking or seconds <= 0 or topic is None:
        return measure(cache, missing, seconds)
    message = {"measure": [astuple(w) for w in lacking], "seconds": seconds}
    processes.share(topic, json.dumps(message))
    counts = measure_share(message, topic, cache)
    counts["hits"] = len({w.key for w in missing}) - len(lacking)
    return counts


def measure_share(message: dict[str, Any], topic: str, cache: TimingCache | None = None) -> dict[str, int]:
    """This process's share of the kernels process 0's plan lacks (`message`: the kernels in the order to measure
    them, and the budget), measured within the budget, then every process's timings taken into this process's
    cache: N processes measure a plan's kernels in about 1/N of the time. Each choice goes whole (all its rivals)
    to the share with the fewest kernels so far (a kernel's compile is most of its measurement)."""
    cache = cache or cache_for(local_device())
    choices: dict[str, list[Wanted]] = {}
    for values in message["measure"]:
        wanted = Wanted(*map(_tupled, values))
        choices.setdefault(wanted.eclass or wanted.key, []).append(wanted)
    shares: list[list[Wanted]] = [[] for _ in range(processes.count())]
    for rivals in choices.values():
        min(shares, key=len).extend(rivals)
    mine = shares[processes.index()]
    counts = measure(cache, mine, message["seconds"])
    with cache.lock:
        timed = {w.key: cache.entries[w.key] for w in mine if w.key in cache.entries}
    found: dict[str, float | None] = {}
    for timings in processes.gather(f"{topic}/kernels", json.dumps(timed)):
        found.update(json.loads(timings))
    with cache.lock:
        cache.entries.update({k: v for k, v in found.items() if k not in cache.entries})
    if cache.path is not None:
        keep_cache(cache.path, cache.save)
    counts["measured_elsewhere"] = len(found) - len(timed)
    return counts


def _tupled(value: Any) -> Any:
    """A value as JSON gave it back, its lists tuples again (a Wanted's attributes and shapes are tuples)."""
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value
