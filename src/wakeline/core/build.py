"""Compile a normalized :class:`~wakeline.catalog.Catalog` into a core :class:`Plan`."""

from __future__ import annotations

from wakeline.catalog import normalized as N
from wakeline.core.plan import (
    CondPlan,
    DerivationPlan,
    FieldRef,
    MetricPlan,
    Plan,
    Pred,
    ScopePlan,
    TriggerPlan,
)

DEFAULT_HOP_S = 60


def _field(ref: N.FieldRef) -> FieldRef:
    return FieldRef(ref.name, ref.type, ref.items,
                    {(b.collection, b.version): (b.annotator if b.backing == "annotation"
                                                 else None, b.path) for b in ref.bindings})


def _scope(scope: N.Scope) -> ScopePlan:
    return ScopePlan(
        frozenset((c.collection, c.version) for c in scope.collections),
        frozenset(scope.types) if scope.types is not None else None,
        frozenset(scope.statuses) if scope.statuses is not None else None,
        tuple(Pred(_field(p.field), p.op, p.value) for p in scope.where),
    )


def _window(w: N.Window | None) -> tuple[float, float] | None:
    if w is None:
        return None
    return (float(w.size_s), float(w.hop_s or min(DEFAULT_HOP_S, w.size_s)))


def _cond(cid: int, trig: N.Trigger, c: N.Condition) -> CondPlan:
    base = {"cid": cid, "kind": c.kind, "trigger": trig.name, "derivation": trig.derivation}
    if isinstance(c, N.WriteCondition):
        return CondPlan(**base, scope=_scope(c.scope))
    if isinstance(c, N.ChangedCondition):
        return CondPlan(**base, scope=_scope(c.scope),
                        keys=frozenset(c.keys) if c.keys is not None else None,
                        transitions=frozenset(c.transitions))
    if isinstance(c, N.RetractionCondition):
        return CondPlan(**base, scope=_scope(c.scope), transitions=frozenset({"removed"}))
    if isinstance(c, N.AccumulatorCondition):
        m = c.metric
        metric = MetricPlan(m.kind, m.aggregate,
                            m.scorer or m.annotator or "", m.path or "")
        return CondPlan(**base, scope=_scope(c.scope), metric=metric,
                        threshold=float(c.threshold), comparison=c.comparison,
                        window=_window(c.window))
    if isinstance(c, N.CensusCondition):
        return CondPlan(**base, scope=_scope(c.scope), threshold=float(c.threshold),
                        window=_window(c.window))
    if isinstance(c, N.LifecycleCondition):
        return CondPlan(**base, first_record=c.first_record, total_records=c.total_records)
    if isinstance(c, N.QuietCondition):
        return CondPlan(**base, scope=_scope(c.scope), after_s=float(c.after_s),
                        max_wait_s=float(c.max_wait_s) if c.max_wait_s is not None else None)
    if isinstance(c, N.AtCondition):
        return CondPlan(**base, scope=_scope(c.scope), at_field=_field(c.field),
                        offset_s=float(c.offset_s))
    if isinstance(c, N.CronCondition):
        return CondPlan(**base, cron_expr=c.expr, cron_entities=c.entities)
    if isinstance(c, N.ReadCondition):
        return CondPlan(**base)
    raise TypeError(f"unknown condition {c!r}")


def build_plan(catalog: N.Catalog) -> Plan:
    derivations = []
    cid = 0
    for index, name in enumerate(sorted(catalog.derivations)):
        d = catalog.derivations[name]
        triggers = []
        for t in catalog.triggers_for(name):
            conds = []
            for c in t.conditions:
                conds.append(_cond(cid, t, c))
                cid += 1
            triggers.append(TriggerPlan(t.name, name, t.hash, tuple(conds),
                                        float(t.cooldown_s) if t.cooldown_s else None,
                                        float(t.debounce_s) if t.debounce_s else None,
                                        float(t.max_wait_s) if t.max_wait_s else None))
        derivations.append(DerivationPlan(
            name, index, _scope(d.source.scope), d.source.mode, d.source.allow_empty,
            tuple(triggers), d.hash, d.function, float(d.timeout_s),
            tuple(e.collection for e in d.emits)))
    keyed = frozenset(n for n, c in catalog.collections.items() if c.keyed)
    return Plan(derivations, keyed, catalog.hash)
