"""Accumulator metrics: ``count``, ``<scorer>``, ``{scorer, aggregate}`` and
``{annotation, path, aggregate}``, checked against the driving source."""

from __future__ import annotations

from wakeline.catalog._common import Collections, Reporter
from wakeline.catalog._yaml import join
from wakeline.catalog.normalized import Derivation, Metric
from wakeline.catalog.schema import MetricSpec

_NUMERIC_AGGREGATES = frozenset({"sum", "avg", "max", "min"})


def compile_metric(
    rep: Reporter, colls_: Collections, file: str, path: str, spec: str | MetricSpec,
    d: Derivation,
) -> Metric | None:
    """Normalize the four metric forms; report unknown/optional/non-numeric sources."""
    colls = [colls_.by_name[r.collection] for r in d.source.collections]
    scorers = sorted({s for c in colls for s in c.scorers})
    if isinstance(spec, str):
        if spec == "count":
            return Metric(kind="count", aggregate="count")
        return _scorer_metric(rep, file, path, spec, "sum", scorers, d)
    if spec.scorer is not None and spec.annotation is not None:
        rep.add(
            "accumulator.scorer_and_annotation", file, path,
            "the metric names both a scorer and an annotation; keep `scorer:` or "
            "`annotation:` + `path:`, not both",
        )
        return None
    if spec.scorer is not None:
        if spec.path is not None:
            rep.add(
                "accumulator.metric", file, join(path, "path"),
                "`path:` goes with `annotation:`; a scorer metric has no path — remove it",
            )
            return None
        return _scorer_metric(rep,
            file, join(path, "scorer"), spec.scorer, spec.aggregate, scorers, d
        )
    if spec.annotation is None:
        rep.add(
            "accumulator.metric", file, path,
            "the metric mapping names neither a scorer nor an annotation; write "
            "`{scorer: <name>, aggregate: ...}` or `{annotation: <name>, path: <leaf>, ...}`",
        )
        return None
    if spec.path is None:
        rep.add(
            "accumulator.metric", file, path,
            f"annotation metric {spec.annotation!r} needs `path:` (the dotted leaf to "
            "aggregate); add it",
        )
        return None
    declaring = [c for c in colls if spec.annotation in c.annotators]
    if not declaring:
        known = sorted({a for c in colls for a in c.annotators}) or ["none"]
        rep.add(
            "accumulator.unknown_annotation", file, join(path, "annotation"),
            f"annotator {spec.annotation!r} is not declared by the driving source "
            f"({', '.join(str(r) for r in d.source.collections)}; annotators: "
            f"{', '.join(known)}); fix the name or declare it under `annotators:`",
        )
        return None
    leaves = [c.annotators[spec.annotation].leaves.get(spec.path) for c in declaring]
    if all(leaf is None for leaf in leaves):
        known = sorted({p for c in declaring for p in c.annotators[spec.annotation].leaves})
        rep.add(
            "accumulator.unknown_annotation", file, join(path, "path"),
            f"annotator {spec.annotation!r} has no leaf {spec.path!r} (leaves: "
            f"{', '.join(known) or 'none'}); fix the path or declare the leaf",
        )
        return None
    optional = [c.name for c in declaring if not c.annotators[spec.annotation].required]
    if optional:
        rep.add(
            "accumulator.optional_annotation", file, join(path, "annotation"),
            f"annotator {spec.annotation!r} is optional (required: false) in "
            f"{', '.join(optional)}; an accumulator aggregates required annotations only — "
            "make it `required: true` or use a scorer",
        )
        return None
    if spec.aggregate in _NUMERIC_AGGREGATES:
        bad = sorted({leaf.type for leaf in leaves if leaf and leaf.type not in
                      ("number", "integer")})
        if bad:
            rep.add(
                "accumulator.non_numeric", file, join(path, "path"),
                f"leaf {spec.annotation}.{spec.path} is {', '.join(bad)}, but aggregate "
                f"{spec.aggregate} needs a number; aggregate a numeric leaf, or use "
                "`aggregate: count` / `distinct_count`",
            )
            return None
    return Metric(
        kind="annotation", aggregate=spec.aggregate, annotator=spec.annotation, path=spec.path
    )

def _scorer_metric(
    rep: Reporter, file: str, path: str, name: str, aggregate: str, scorers: list[str],
    d: Derivation,
) -> Metric | None:
    if name not in scorers:
        rep.add(
            "accumulator.unknown_scorer", file, path,
            f"scorer {name!r} is not declared by the driving source "
            f"({', '.join(str(r) for r in d.source.collections)}; scorers: "
            f"{', '.join(scorers) or 'none'}); fix the name, declare it under a driving "
            "collection's `scorers:`, or use `metric: count`",
        )
        return None
    return Metric(kind="scorer", aggregate=aggregate, scorer=name)  # type: ignore[arg-type]
