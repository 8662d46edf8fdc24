"""Compile one trigger body (inline or standalone) into a normalized Trigger."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any, Literal

from croniter import croniter

from wakeline.catalog._common import (
    MAX_OFFSET_S,
    Collections,
    Reporter,
    check_duration,
    dedupe_sorted,
)
from wakeline.catalog._metrics import compile_metric
from wakeline.catalog._scopes import ScopeCompiler
from wakeline.catalog._yaml import join
from wakeline.catalog.normalized import (
    DATA_KINDS,
    AccumulatorCondition,
    AtCondition,
    CensusCondition,
    ChangedCondition,
    Condition,
    CronCondition,
    Derivation,
    LifecycleCondition,
    QuietCondition,
    ReadCondition,
    RetractionCondition,
    Trigger,
    Window,
    WriteCondition,
    semantic_hash,
)
from wakeline.catalog.schema import (
    CONDITION_KINDS,
    AccumulatorSpec,
    AtSpec,
    CensusSpec,
    ChangedSpec,
    CronSpec,
    LifecycleSpec,
    QuietSpec,
    TriggerBody,
    WindowSpec,
)

_NUMERIC_AGGREGATES = frozenset({"sum", "avg", "max", "min"})
_TRANSITIONS = ("added", "changed", "removed")
_CRON_MACROS = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight",
                          "@hourly"})
_CRON_PROBE = datetime(2000, 1, 1, tzinfo=UTC)


def normalize_cron(expr: str) -> str | None:
    """The whitespace-normalized expression, or None if it is not a valid UTC schedule."""
    text = " ".join(expr.split())
    if text.lower() in _CRON_MACROS:
        return text.lower()
    if len(text.split(" ")) != 5:
        return None
    try:
        if not croniter.is_valid(text):
            return None
        croniter(text, _CRON_PROBE).get_next(datetime)
    except Exception:  # croniter raises several unrelated types for unsatisfiable specs
        return None
    return text


class TriggerCompiler:
    def __init__(self, rep: Reporter, colls: Collections) -> None:
        self.rep = rep
        self.colls = colls
        self.scopes = ScopeCompiler(rep, colls)

    def compile(
        self, *, name: str, derivation: Derivation, body: TriggerBody, file: str, base: str,
        origin: Literal["inline", "standalone"],
    ) -> Trigger | None:
        before = self.rep.count()
        if "read" in body.model_fields_set and body.read is None:
            self.rep.add(
                "schema.invalid", file, join(base, "read"),
                "`read:` has no value; write `read: true` to enable the read condition",
            )
            return None
        declared = [k for k in CONDITION_KINDS if getattr(body, k) not in (None, False)]
        if not declared:
            self.rep.add(
                "trigger.no_conditions", file, base,
                f"trigger {name!r} enables no condition; add at least one of "
                f"{', '.join(CONDITION_KINDS)} (manual runs need no trigger — delete it instead)",
            )
            return None
        debounced = body.debounce_s is not None
        conditions: list[Condition] = []
        for kind in declared:
            path = join(base, kind)
            cond = getattr(self, f"_{kind}")(file, path, getattr(body, kind), derivation)
            if cond is not None:
                if kind in DATA_KINDS and debounced:
                    cond = cond.model_copy(update={"debounced": True})
                conditions.append(cond)
        self._pacing(file, base, body, declared)
        if self.rep.count() > before:
            return None
        trigger = Trigger(
            name=name, derivation=derivation.name, origin=origin, conditions=tuple(conditions),
            cooldown_s=body.cooldown_s, debounce_s=body.debounce_s, max_wait_s=body.max_wait_s,
            file=file, description=body.description,
        )
        return trigger.model_copy(update={"hash": semantic_hash(trigger)})

    # -- pacing -------------------------------------------------------------------------

    def _pacing(self, file: str, base: str, body: TriggerBody, declared: list[str]) -> None:
        check_duration(self.rep, file, join(base, "cooldown_s"), body.cooldown_s, "cooldown_s")
        check_duration(self.rep, file, join(base, "debounce_s"), body.debounce_s, "debounce_s")
        check_duration(self.rep, file, join(base, "max_wait_s"), body.max_wait_s, "max_wait_s")
        if body.debounce_s is not None and not DATA_KINDS.intersection(declared):
            self.rep.add(
                "pacing.debounce_inapplicable", file, join(base, "debounce_s"),
                f"debounce_s only delays data conditions ({', '.join(sorted(DATA_KINDS))}) and "
                f"this trigger has only {', '.join(declared)}; remove debounce_s (quiet has "
                "its own after_s)",
            )
        if body.max_wait_s is not None:
            if body.debounce_s is None:
                self.rep.add(
                    "pacing.max_wait", file, join(base, "max_wait_s"),
                    "max_wait_s bounds a debounce window, and this trigger has no debounce_s; "
                    "add debounce_s or remove max_wait_s (quiet takes its own max_wait_s)",
                )
            elif body.max_wait_s < body.debounce_s:
                self.rep.add(
                    "pacing.max_wait", file, join(base, "max_wait_s"),
                    f"max_wait_s ({body.max_wait_s}) is shorter than debounce_s "
                    f"({body.debounce_s}); set max_wait_s >= debounce_s",
                )

    def _window(self, file: str, path: str, spec: WindowSpec | None) -> Window | None:
        if spec is None:
            return None
        ok = check_duration(self.rep, file, join(path, "size_s"), spec.size_s, "window size_s")
        # Default hop: a minute (or the whole window when it is shorter), so a
        # "≥ N within 10 minutes" window slides instead of tumbling (docs/semantics.md).
        hop = min(60, spec.size_s) if spec.hop_s is None else spec.hop_s
        if spec.hop_s is not None:
            ok = check_duration(self.rep, file, join(path, "hop_s"), hop, "window hop_s") and ok
        if ok and hop > spec.size_s:
            self.rep.add(
                "window.invalid", file, join(path, "hop_s"),
                f"hop_s ({hop}) is larger than size_s ({spec.size_s}), leaving gaps no window "
                "covers; set hop_s <= size_s (omit it for a 60 s hop)",
            )
        return Window(size_s=spec.size_s, hop_s=hop)

    # -- conditions ---------------------------------------------------------------------

    def _write(self, file: str, path: str, spec: Any, d: Derivation) -> Condition | None:
        scope = self.scopes.scope(file, path, "write", spec, d)
        return None if scope is None else WriteCondition(scope=scope, yaml_path=path)

    def _retraction(self, file: str, path: str, spec: Any, d: Derivation) -> Condition | None:
        scope = self.scopes.scope(file, path, "retraction", spec, d)
        return None if scope is None else RetractionCondition(scope=scope, yaml_path=path)

    def _changed(self, file: str, path: str, spec: ChangedSpec, d: Derivation) -> Condition | None:
        scope = self.scopes.scope(file, path, "changed", spec, d)
        ok = scope is not None
        keys = dedupe_sorted(spec.keys)
        if spec.keys is not None and not spec.keys:
            self.rep.add(
                "scope.empty", file, join(path, "keys"),
                "`keys: []` watches nothing; list keys or omit `keys:` to watch every key",
            )
            ok = False
        if scope is not None and keys:
            declared: set[str] = set()
            open_space = False
            for ref in scope.collections:
                ks = self.colls.by_name[ref.collection].keys
                if ks is None:
                    open_space = True
                else:
                    declared.update(ks)
            unknown = [k for k in keys if k not in declared]
            if not open_space and unknown:
                self.rep.add(
                    "changed.unknown_key", file, join(path, "keys"),
                    f"key(s) {', '.join(unknown)} are not declared by the scoped collections "
                    f"(keys: {', '.join(sorted(declared))}); fix the key names or add them to "
                    "the collection's `keys:`",
                )
                ok = False
        transitions: tuple[str, ...] = _TRANSITIONS
        if spec.transitions is not None:
            if not spec.transitions:
                self.rep.add(
                    "changed.transitions", file, join(path, "transitions"),
                    "`transitions: []` never fires; list some of added, changed, removed or "
                    "omit it for all three",
                )
                ok = False
            transitions = tuple(t for t in _TRANSITIONS if t in spec.transitions)
        if not ok or scope is None:
            return None
        return ChangedCondition(
            scope=scope, keys=keys, transitions=transitions, yaml_path=path  # type: ignore[arg-type]
        )

    def _accumulator(
        self, file: str, path: str, spec: AccumulatorSpec, d: Derivation
    ) -> Condition | None:
        before = self.rep.count()
        metric = compile_metric(self.rep, self.colls, file, join(path, "metric"), spec.metric, d)
        t = spec.threshold
        if not math.isfinite(t):
            self.rep.add(
                "accumulator.threshold", file, join(path, "threshold"),
                f"threshold {t} is not a finite number; write a finite number",
            )
        elif spec.comparison == "gte" and t <= 0:
            self.rep.add(
                "accumulator.threshold", file, join(path, "threshold"),
                f"a gte threshold must be positive (got {t}): a non-positive floor fires on any "
                "backlog; set threshold > 0, or use `comparison: lte` for a ceiling",
            )
        window = self._window(file, join(path, "window"), spec.window)
        if self.rep.count() > before or metric is None:
            return None
        return AccumulatorCondition(
            scope=d.source.scope, metric=metric, threshold=float(t),
            comparison=spec.comparison, window=window, yaml_path=path,
        )

    def _census(self, file: str, path: str, spec: CensusSpec, d: Derivation) -> Condition | None:
        scope = self.scopes.scope(file, path, "census", spec, d)
        ok = scope is not None
        if spec.threshold < 1:
            self.rep.add(
                "census.threshold", file, join(path, "threshold"),
                f"census threshold {spec.threshold} is below 1; set threshold >= 1",
            )
            ok = False
        window = self._window(file, join(path, "window"), spec.window)
        if not ok or scope is None:
            return None
        return CensusCondition(scope=scope, threshold=spec.threshold, window=window, yaml_path=path)

    def _lifecycle(
        self, file: str, path: str, spec: LifecycleSpec, d: Derivation
    ) -> Condition | None:
        if not spec.first_record and spec.total_records is None:
            self.rep.add(
                "lifecycle.empty", file, path,
                "lifecycle enables neither milestone; add `first_record: true` and/or "
                "`total_records: <N>`, or remove the lifecycle block",
            )
            return None
        if spec.total_records is not None and spec.total_records < 1:
            self.rep.add(
                "lifecycle.total_records", file, join(path, "total_records"),
                f"total_records {spec.total_records} is below 1; set a positive record count",
            )
            return None
        return LifecycleCondition(
            scope=d.source.scope, first_record=spec.first_record,
            total_records=spec.total_records, yaml_path=path,
        )

    def _quiet(self, file: str, path: str, spec: QuietSpec, d: Derivation) -> Condition | None:
        scope = self.scopes.scope(file, path, "quiet", spec, d)
        ok = check_duration(self.rep, file, join(path, "after_s"), spec.after_s, "after_s")
        ok = check_duration(
            self.rep, file, join(path, "max_wait_s"), spec.max_wait_s, "max_wait_s"
        ) and ok
        if ok and spec.max_wait_s is not None and spec.max_wait_s < spec.after_s:
            self.rep.add(
                "pacing.max_wait", file, join(path, "max_wait_s"),
                f"max_wait_s ({spec.max_wait_s}) is shorter than after_s ({spec.after_s}); "
                "set max_wait_s >= after_s",
            )
            ok = False
        if not ok or scope is None:
            return None
        return QuietCondition(
            scope=scope, after_s=spec.after_s, max_wait_s=spec.max_wait_s, yaml_path=path
        )

    def _at(self, file: str, path: str, spec: AtSpec, d: Derivation) -> Condition | None:
        scope = self.scopes.scope(file, path, "at", spec, d)
        ok = abs(spec.offset_s) <= MAX_OFFSET_S
        if not ok:
            self.rep.add(
                "duration.range", file, join(path, "offset_s"),
                f"offset_s is {spec.offset_s} s, beyond ±{MAX_OFFSET_S} s (366 days); set a value "
                f"between -{MAX_OFFSET_S} and {MAX_OFFSET_S}",
            )
        if scope is None:
            return None
        field = self._at_field(file, join(path, "field"), scope.collections, spec.field)
        if field is None or not ok:
            return None
        if d.source.mode == "changes":
            self.rep.warn(
                "at.changes_source", file, path,
                f"derivation {d.name!r} reads a `mode: changes` source, whose cursor may have "
                "consumed the dated record long before its deadline; consider mode snapshot, "
                "current or view",
            )
        return AtCondition(scope=scope, field=field, offset_s=spec.offset_s, yaml_path=path)

    def _at_field(self, file: str, path: str, refs: Any, name: str) -> Any:
        problems = []
        for ref, f in self.scopes.field_decls(refs, name):
            if f is None:
                problems.append(f"{ref} does not declare it")
            elif f.type != "datetime":
                problems.append(f"{ref} declares it as {f.type}")
            elif not f.filterable:
                problems.append(f"{ref} declares it filterable: false")
            elif not f.required:
                problems.append(f"{ref} backs it by the optional annotator {f.annotator!r}")
        if problems:
            self.rep.add(
                "at.bad_field", file, path,
                f"at field {name!r} must be a filterable datetime scalar declared by every "
                f"scoped collection version, but {'; '.join(problems)}; declare "
                f"`{name}: {{type: datetime}}` in each, or point `field:` at such a field",
            )
            return None
        return self.scopes.field_ref(file, path, refs, name, "at")

    def _cron(self, file: str, path: str, spec: CronSpec, d: Derivation) -> Condition | None:
        expr = normalize_cron(spec.expr)
        if expr is None:
            self.rep.add(
                "cron.invalid", file, join(path, "expr"),
                f"{spec.expr!r} is not a valid cron expression; write five fields "
                "(minute hour day-of-month month day-of-week, evaluated in UTC), e.g. "
                "\"0 3 * * *\", or a macro such as @daily",
            )
            return None
        return CronCondition(expr=expr, entities=spec.entities, yaml_path=path)

    def _read(self, file: str, path: str, spec: bool, d: Derivation) -> Condition | None:
        return ReadCondition(yaml_path=path)
