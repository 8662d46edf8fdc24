"""Every compile-time rule: one rejecting case (code, file, YAML path, how-to-fix) and
one accepting case that differs from it only in the offending detail."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from tests.unit.catalog.helpers import MAIN, D, P, assert_ok, build, merged, only, standalone
from tests.unit.catalog.helpers import with_trigger as trig

DF = "derivations/d.yaml"
PF = "derivations/p.yaml"
BOTH = merged(D, source={"collections": ["main@1", "main@2"]})


def ptrig(body: Any) -> dict[str, Any]:
    return trig(body, P)


def btrig(body: Any) -> dict[str, Any]:
    return trig(body, BOTH)


class Reject(NamedTuple):
    id: str
    overrides: dict[str, Any]
    code: str
    file: str
    path: str
    fix: str  # a phrase of the message that tells the user what to do


class Accept(NamedTuple):
    id: str
    overrides: dict[str, Any]


REJECT = [
    # -- enricher.unknown / enricher function ---------------------------------------------
    Reject("enricher-unknown-name",
           {"collections/main.yaml": merged(MAIN, enrichers={"relevance": "mod:fn"})},
           "enricher.unknown", "collections/main.yaml", "enrichers.relevance",
           "declare it or fix the name"),
    Reject("enricher-bad-function",
           {"collections/main.yaml": merged(MAIN, enrichers={"importance": "not a function"})},
           "function.invalid", "collections/main.yaml", "enrichers.importance",
           "'module:function'"),
    # -- trigger.no_conditions ------------------------------------------------------------
    Reject("no-conditions-pacing-only", trig({"cooldown_s": 60}), "trigger.no_conditions", DF,
           "trigger", "add at least one of"),
    Reject("no-conditions-read-false", trig({"read": False}), "trigger.no_conditions", DF,
           "trigger", "add at least one of"),
    Reject("no-conditions-standalone", standalone("d.extra", {"cooldown_s": 5}),
           "trigger.no_conditions", "triggers/d.extra.yaml", "", "manual runs need no trigger"),
    # -- cron.invalid ---------------------------------------------------------------------------
    Reject("cron-bad-minute", trig({"cron": {"expr": "61 3 * * *"}}), "cron.invalid", DF,
           "trigger.cron.expr", "write five fields"),
    Reject("cron-four-fields", trig({"cron": {"expr": "0 3 * *"}}), "cron.invalid", DF,
           "trigger.cron.expr", "write five fields"),
    Reject("cron-seconds-field", trig({"cron": {"expr": "0 0 3 * * *"}}), "cron.invalid", DF,
           "trigger.cron.expr", "write five fields"),
    Reject("cron-garbage", trig({"cron": {"expr": "nightly"}}), "cron.invalid", DF,
           "trigger.cron.expr", "e.g. \"0 3 * * *\""),
    # -- scope.not_subset ---------------------------------------------------------------------
    Reject("subset-write-collection", trig({"write": {"collections": ["profiles"]}}),
           "scope.not_subset", DF, "trigger.write.collections", "add profiles@1 to the derivation"),
    Reject("subset-quiet-type", trig({"quiet": {"types": ["note"], "after_s": 60}}),
           "scope.not_subset", DF, "trigger.quiet.types", "narrow this list"),
    Reject("subset-write-status", trig({"write": {"statuses": ["archived"]}}),
           "scope.not_subset", DF, "trigger.write.statuses", "narrow this list"),
    Reject("subset-version", trig({"write": {"collections": ["main@1"]}}),
           "scope.not_subset", DF, "trigger.write.collections", "add main@1"),
    Reject("subset-changed", ptrig({"changed": {"collections": ["profiles"],
                                                "statuses": ["active", "draft"]}}),
           "scope.not_subset", PF, "trigger.changed.statuses", "narrow this list"),
    Reject("subset-retraction", ptrig({"retraction": {"collections": ["profiles", "legacy@2"]}}),
           "scope.not_subset", PF, "trigger.retraction.collections", "remove it from this scope"),
    Reject("subset-non-consumable-version",
           trig({"write": {"collections": ["legacy@1"]}},
                merged(D, source={"collections": ["main", "legacy@2"]})),
           "scope.not_subset", DF, "trigger.write.collections", "consumable: false"),
    # -- where -----------------------------------------------------------------------------------
    Reject("where-undeclared", trig({"write": {"where": {"nope": {"eq": 1}}}}),
           "where.undeclared", DF, "trigger.write.where.nope", "declare it under `fields:`"),
    Reject("where-undeclared-one-version",
           btrig({"write": {"where": {"valence": {"gte": 0.5}}}}),
           "where.undeclared", DF, "trigger.write.where.valence", "main@1"),
    Reject("where-undeclared-census", trig({"census": {"collections": ["notes"], "threshold": 2,
                                                        "where": {"mood": {"eq": "x"}}}}),
           "where.undeclared", DF, "trigger.census.where.mood", "narrow `collections:`"),
    Reject("where-undeclared-at", trig({"at": {"collections": ["notes"], "field": "due",
                                               "where": {"mood": {"eq": "x"}}}}),
           "where.undeclared", DF, "trigger.at.where.mood", "declare it"),
    Reject("where-incompatible-versions", btrig({"write": {"where": {"kind": {"eq": 3}}}}),
           "where.incompatible", DF, "trigger.write.where.kind", "declare one type"),
    Reject("where-contains-any-scalar",
           trig({"write": {"where": {"session_id": {"contains_any": ["a"]}}}}),
           "where.incompatible", DF, "trigger.write.where.session_id.contains_any",
           "use `in:` or `eq:`"),
    Reject("where-gt-boolean", trig({"write": {"where": {"flag": {"gt": True}}}}),
           "where.incompatible", DF, "trigger.write.where.flag.gt", "use `eq:`"),
    Reject("where-in-array", trig({"write": {"where": {"tags": {"in": ["a"]}}}}),
           "where.incompatible", DF, "trigger.write.where.tags.in", "use `contains_any:`"),
    Reject("where-operand-type", trig({"write": {"where": {"score": {"gte": "high"}}}}),
           "where.incompatible", DF, "trigger.write.where.score.gte", "write a number value"),
    Reject("where-operand-integer", trig({"write": {"where": {"count": {"eq": 1.5}}}}),
           "where.incompatible", DF, "trigger.write.where.count.eq", "write an integer value"),
    Reject("where-naive-datetime",
           trig({"write": {"where": {"when": {"gte": "2026-01-01T00:00:00"}}}}),
           "where.incompatible", DF, "trigger.write.where.when.gte", "add one"),
    Reject("where-array-items-type",
           trig({"write": {"where": {"tags": {"contains_all": ["a", 3]}}}}),
           "where.incompatible", DF, "trigger.write.where.tags.contains_all",
           "every listed value must be a string"),
    Reject("where-null-operand", trig({"write": {"where": {"session_id": {"eq": None}}}}),
           "where.incompatible", DF, "trigger.write.where.session_id.eq", "exists: false"),
    Reject("where-exists-not-bool", trig({"write": {"where": {"tags": {"exists": "yes"}}}}),
           "schema.invalid", DF, "trigger.write.where.tags.exists", "fix the value"),
    Reject("where-not-filterable", trig({"write": {"where": {"body": {"exists": True}}}}),
           "where.not_filterable", DF, "trigger.write.where.body", "mark it filterable"),
    Reject("where-object-not-filterable", trig({"write": {"where": {"payload": {"exists": True}}}}),
           "where.not_filterable", DF, "trigger.write.where.payload", "filter on another field"),
    Reject("where-optional-annotation", trig({"write": {"where": {"draft": {"gte": 0.5}}}}),
           "where.optional_annotation", DF, "trigger.write.where.draft", "`required: true`"),
    Reject("where-optional-annotation-quiet",
           trig({"quiet": {"after_s": 60, "where": {"draft": {"gte": 0.5}}}}),
           "where.optional_annotation", DF, "trigger.quiet.where.draft", "`required: true`"),
    Reject("where-empty", trig({"write": {"where": {"tags": {}}}}), "where.empty", DF,
           "trigger.write.where.tags", "add one of"),
    # -- at.bad_field -------------------------------------------------------------------------
    Reject("at-string-field", trig({"at": {"field": "session_id"}}), "at.bad_field", DF,
           "trigger.at.field", "declares it as string"),
    Reject("at-undeclared", btrig({"at": {"field": "seen_at"}}), "at.bad_field", DF,
           "trigger.at.field", "main@1 does not declare it"),
    Reject("at-array", trig({"at": {"field": "whens"}}), "at.bad_field", DF, "trigger.at.field",
           "{type: datetime}"),
    Reject("at-optional-annotation", trig({"at": {"field": "draft_at"}}), "at.bad_field", DF,
           "trigger.at.field", "optional annotator"),
    Reject("at-not-filterable",
           trig({"at": {"field": "due"}},
                merged(D, source={"collections": ["nd"]}),
                **{"collections/nd.yaml": {"name": "nd", "fields": {
                    "due": {"type": "datetime", "filterable": False}}}}),
           "at.bad_field", DF, "trigger.at.field", "filterable: false"),
    # -- accumulator -----------------------------------------------------------------------------
    Reject("acc-unknown-scorer-shorthand",
           trig({"accumulator": {"metric": "relevance", "threshold": 5}}),
           "accumulator.unknown_scorer", DF, "trigger.accumulator.metric", "metric: count"),
    Reject("acc-unknown-scorer",
           trig({"accumulator": {"metric": {"scorer": "relevance"}, "threshold": 5}}),
           "accumulator.unknown_scorer", DF, "trigger.accumulator.metric.scorer", "fix the name"),
    Reject("acc-unknown-annotator",
           trig({"accumulator": {"metric": {"annotation": "nope_v1", "path": "x"},
                                 "threshold": 5}}),
           "accumulator.unknown_annotation", DF, "trigger.accumulator.metric.annotation",
           "declare it under `annotators:`"),
    Reject("acc-unknown-leaf",
           trig({"accumulator": {"metric": {"annotation": "sentiment_v1", "path": "arousal"},
                                 "threshold": 5}}),
           "accumulator.unknown_annotation", DF, "trigger.accumulator.metric.path",
           "declare the leaf"),
    Reject("acc-non-numeric",
           trig({"accumulator": {"metric": {"annotation": "sentiment_v1", "path": "label",
                                            "aggregate": "avg"}, "threshold": 5}}),
           "accumulator.non_numeric", DF, "trigger.accumulator.metric.path",
           "aggregate a numeric leaf"),
    Reject("acc-scorer-and-annotation",
           trig({"accumulator": {"metric": {"scorer": "importance", "annotation": "sentiment_v1",
                                            "path": "valence"}, "threshold": 5}}),
           "accumulator.scorer_and_annotation", DF, "trigger.accumulator.metric", "not both"),
    Reject("acc-optional-annotation",
           trig({"accumulator": {"metric": {"annotation": "draft_v1", "path": "score"},
                                 "threshold": 5}}),
           "accumulator.optional_annotation", DF, "trigger.accumulator.metric.annotation",
           "`required: true`"),
    Reject("acc-annotation-without-path",
           trig({"accumulator": {"metric": {"annotation": "sentiment_v1"}, "threshold": 5}}),
           "accumulator.metric", DF, "trigger.accumulator.metric", "needs `path:`"),
    Reject("acc-empty-metric", trig({"accumulator": {"metric": {"aggregate": "max"},
                                                     "threshold": 5}}),
           "accumulator.metric", DF, "trigger.accumulator.metric", "write `{scorer:"),
    Reject("acc-threshold-zero", trig({"accumulator": {"metric": "importance", "threshold": 0}}),
           "accumulator.threshold", DF, "trigger.accumulator.threshold", "set threshold > 0"),
    Reject("acc-threshold-negative-gte",
           trig({"accumulator": {"metric": "count", "threshold": -1}}),
           "accumulator.threshold", DF, "trigger.accumulator.threshold", "comparison: lte"),
    Reject("acc-threshold-nan", trig({"accumulator": {"metric": "count", "threshold": float("nan"),
                                                      "comparison": "lte"}}),
           "accumulator.threshold", DF, "trigger.accumulator.threshold", "write a finite number"),
    Reject("acc-threshold-inf", trig({"accumulator": {"metric": "count",
                                                      "threshold": float("inf")}}),
           "accumulator.threshold", DF, "trigger.accumulator.threshold", "write a finite number"),
    # -- keyed / lifecycle / census / changed ---------------------------------------------------
    Reject("changed-event-collection", trig({"changed": {}}), "scope.not_keyed", DF,
           "trigger.changed.collections", "scope keyed collections only"),
    Reject("retraction-keyed-false", ptrig({"retraction": {"keyed": False}}), "scope.not_keyed",
           PF, "trigger.retraction.keyed", "remove `keyed: false`"),
    Reject("keyed-mismatch", trig({"write": {"keyed": True}}), "scope.keyed_mismatch", DF,
           "trigger.write.keyed", "drop `keyed:`"),
    Reject("lifecycle-empty", trig({"lifecycle": {}}), "lifecycle.empty", DF, "trigger.lifecycle",
           "add `first_record: true`"),
    Reject("lifecycle-false", trig({"lifecycle": {"first_record": False}}), "lifecycle.empty", DF,
           "trigger.lifecycle", "`total_records: <N>`"),
    Reject("lifecycle-total-zero", trig({"lifecycle": {"total_records": 0}}),
           "lifecycle.total_records", DF, "trigger.lifecycle.total_records", "set a positive"),
    Reject("census-threshold", trig({"census": {"threshold": 0}}), "census.threshold", DF,
           "trigger.census.threshold", "set threshold >= 1"),
    Reject("changed-transitions-empty", ptrig({"changed": {"transitions": []}}),
           "changed.transitions", PF, "trigger.changed.transitions", "omit it for all three"),
    Reject("changed-unknown-key", ptrig({"changed": {"keys": ["rolee"]}}), "changed.unknown_key",
           PF, "trigger.changed.keys", "fix the key names"),
    Reject("scope-empty-types", trig({"write": {"types": []}}), "scope.empty", DF,
           "trigger.write.types", "omit the key"),
    Reject("source-unknown-type", {DF: merged(D, source={"collections": ["main"],
                                                         "types": ["chat", "obs"]})},
           "scope.unknown_type", DF, "source.types", "add them to the collection's `types:`"),
    Reject("scope-unknown-type", trig({"census": {"collections": ["notes"], "types": ["sumary"],
                                                  "threshold": 1}}),
           "scope.unknown_type", DF, "trigger.census.types", "fix the type names"),
    # -- durations and pacing --------------------------------------------------------------------
    Reject("after-s-zero", trig({"quiet": {"after_s": 0}}), "duration.range", DF,
           "trigger.quiet.after_s", "set a value between 1 and 604800"),
    Reject("after-s-too-long", trig({"quiet": {"after_s": 604801}}), "duration.range", DF,
           "trigger.quiet.after_s", "set a value between 1 and 604800"),
    Reject("debounce-too-long", trig({"write": {}, "debounce_s": 700000}), "duration.range", DF,
           "trigger.debounce_s", "set a value between"),
    Reject("debounce-zero", trig({"write": {}, "debounce_s": 0}), "duration.range", DF,
           "trigger.debounce_s", "set a value between"),
    Reject("cooldown-negative", trig({"write": {}, "cooldown_s": -5}), "duration.range", DF,
           "trigger.cooldown_s", "set a value between"),
    Reject("max-wait-range", trig({"write": {}, "debounce_s": 10, "max_wait_s": 10**7}),
           "duration.range", DF, "trigger.max_wait_s", "set a value between"),
    Reject("quiet-max-wait-range", trig({"quiet": {"after_s": 10, "max_wait_s": 0}}),
           "duration.range", DF, "trigger.quiet.max_wait_s", "set a value between"),
    Reject("window-size-range", trig({"accumulator": {"metric": "count", "threshold": 5,
                                                      "window": {"size_s": 0}}}),
           "duration.range", DF, "trigger.accumulator.window.size_s", "set a value between"),
    Reject("census-window-range", trig({"census": {"threshold": 3,
                                                   "window": {"size_s": 60, "hop_s": 0}}}),
           "duration.range", DF, "trigger.census.window.hop_s", "set a value between"),
    Reject("timeout-range", {DF: merged(D, timeout_s=0)}, "duration.range", DF, "timeout_s",
           "set a value between"),
    Reject("offset-range", trig({"at": {"field": "when", "offset_s": 10**9}}), "duration.range",
           DF, "trigger.at.offset_s", "set a value between"),
    Reject("window-hop-gt-size", trig({"accumulator": {"metric": "count", "threshold": 5,
                                                       "window": {"size_s": 60, "hop_s": 120}}}),
           "window.invalid", DF, "trigger.accumulator.window.hop_s", "set hop_s <= size_s"),
    Reject("max-wait-without-debounce", trig({"write": {}, "max_wait_s": 60}), "pacing.max_wait",
           DF, "trigger.max_wait_s", "add debounce_s"),
    Reject("max-wait-below-debounce", trig({"write": {}, "debounce_s": 60, "max_wait_s": 30}),
           "pacing.max_wait", DF, "trigger.max_wait_s", "set max_wait_s >= debounce_s"),
    Reject("quiet-max-wait-below-after", trig({"quiet": {"after_s": 60, "max_wait_s": 30}}),
           "pacing.max_wait", DF, "trigger.quiet.max_wait_s", "set max_wait_s >= after_s"),
    Reject("debounce-on-cron", trig({"cron": {"expr": "0 3 * * *"}, "debounce_s": 30}),
           "pacing.debounce_inapplicable", DF, "trigger.debounce_s", "remove debounce_s"),
    # -- references and names --------------------------------------------------------------------
    Reject("unknown-derivation", standalone("x.nightly", {"cron": {"expr": "@daily"}}, "nope"),
           "trigger.unknown_derivation", "triggers/x.nightly.yaml", "processor",
           "add derivations/nope.yaml"),
    Reject("unknown-derivation-alias",
           {"triggers/x.yaml": {"name": "x", "derivation": "nope", "read": True}},
           "trigger.unknown_derivation", "triggers/x.yaml", "derivation", "fix the name"),
    Reject("two-targets", {"triggers/x.yaml": {"name": "x", "derivation": "d", "processor": "d",
                                               "read": True}},
           "trigger.processor", "triggers/x.yaml", "derivation", "remove the other alias"),
    Reject("no-target", {"triggers/x.yaml": {"name": "x", "read": True}},
           "trigger.processor", "triggers/x.yaml", "", "write `processor:"),
    Reject("duplicate-trigger-inline", standalone("d.default", {"read": True}), "name.duplicate",
           "triggers/d.default.yaml", "name", "rename this one"),
    Reject("duplicate-trigger-standalone",
           {**standalone("d.a", {"read": True}),
            "triggers/other.yaml": {"name": "d.a", "processor": "d", "read": True}},
           "name.duplicate", "triggers/other.yaml", "name", "rename this one"),
    Reject("duplicate-collection", {"collections/main2.yaml": merged(MAIN)}, "name.duplicate",
           "collections/main2.yaml", "name", "rename one of them"),
    Reject("duplicate-derivation", {"derivations/z.yaml": merged(D)}, "name.duplicate",
           "derivations/z.yaml", "name", "rename one of them"),
    Reject("bad-trigger-name", standalone("Nightly Run", {"read": True}), "name.invalid",
           "triggers/Nightly Run.yaml", "name", "rename it"),
    Reject("bad-derivation-name", {DF: merged(D, name="D!")}, "name.invalid", DF, "name",
           "rename it"),
    Reject("long-derivation-name", {DF: merged(D, name="d" * 60)}, "name.invalid", DF, "name",
           "shorten it"),
    Reject("bad-collection-name", {"collections/notes.yaml": merged(
        {"name": "Notes", "fields": {}}), DF: merged(D, emits=[])}, "name.invalid",
           "collections/notes.yaml", "name", "rename it"),
    Reject("bad-field-name", {"collections/x.yaml": {"name": "x", "fields": {"a-b": "string"}}},
           "name.invalid", "collections/x.yaml", "fields.a-b", "content: a.b"),
    Reject("unknown-collection-scope", trig({"census": {"collections": ["nope"], "threshold": 1}}),
           "collection.unknown", DF, "trigger.census.collections[0]", "add collections/nope.yaml"),
    Reject("unknown-collection-source", {DF: merged(D, source={"collections": ["nope"]})},
           "collection.unknown", DF, "source.collections[0]", "fix the name"),
    Reject("unknown-collection-emits", {DF: merged(D, emits=["nope"])}, "collection.unknown", DF,
           "emits[0]", "fix the name"),
    Reject("unknown-version", {DF: merged(D, source={"collections": ["main@7"]})},
           "collection.unknown_version", DF, "source.collections[0]", "omit @version"),
    Reject("active-version-unknown", {"collections/x.yaml": {"name": "x", "active_version": 4,
                                                             "fields": {"a": "string"}}},
           "collection.unknown_version", "collections/x.yaml", "active_version", "pick one"),
    Reject("version-duplicate", {"collections/x.yaml": {"name": "x", "versions": [
        {"version": 1}, {"version": 1}]}}, "collection.version_duplicate", "collections/x.yaml",
           "versions[1].version", "its own number"),
    Reject("versions-and-fields", {"collections/x.yaml": {"name": "x", "versions": [
        {"version": 1}], "fields": {"a": "string"}}}, "collection.versions_and_fields",
           "collections/x.yaml", "fields", "move these fields"),
    Reject("source-not-consumable", {DF: merged(D, source={"collections": ["legacy@1"]})},
           "collection.not_consumable", DF, "source.collections[0]", "read a consumable version"),
    Reject("function-no-colon", {DF: merged(D, function="mod.fn")}, "function.invalid", DF,
           "function", "write e.g."),
    Reject("field-array-without-items", {"collections/x.yaml": {"name": "x", "fields": {
        "tags": "array"}}}, "field.invalid", "collections/x.yaml", "fields.tags",
           "{type: array, items: string}"),
    Reject("field-items-on-scalar", {"collections/x.yaml": {"name": "x", "fields": {
        "tags": {"type": "string", "items": "string"}}}}, "field.invalid", "collections/x.yaml",
           "fields.tags.items", "remove it"),
    Reject("field-filterable-object", {"collections/x.yaml": {"name": "x", "fields": {
        "o": {"type": "object", "filterable": True}}}}, "field.invalid", "collections/x.yaml",
           "fields.o.filterable", "declare the scalar leaves"),
    Reject("field-no-type", {"collections/x.yaml": {"name": "x", "fields": {"o": {}}}},
           "field.invalid", "collections/x.yaml", "fields.o", "add it"),
    Reject("field-unknown-annotator", {"collections/x.yaml": {"name": "x", "fields": {
        "v": {"annotation": "nope", "path": "v"}}}}, "field.unknown_annotator",
           "collections/x.yaml", "fields.v.annotation", "declare it under `annotators:`"),
    Reject("field-unknown-leaf", {"collections/x.yaml": {"name": "x", "annotators": [
        {"name": "a1", "leaves": {"v": "number"}}], "fields": {
        "v": {"annotation": "a1", "path": "w"}}}}, "field.unknown_leaf", "collections/x.yaml",
           "fields.v.path", "add it to the annotator's `leaves:`"),
    Reject("field-annotation-mismatch", {"collections/x.yaml": {"name": "x", "annotators": [
        {"name": "a1", "leaves": {"v": "number"}}], "fields": {
        "v": {"annotation": "a1", "path": "v", "type": "string"}}}},
           "field.annotation_mismatch", "collections/x.yaml", "fields.v.type", "make them agree"),
    Reject("keys-on-event-collection", {"collections/x.yaml": {"name": "x", "keys": ["a"]}},
           "field.invalid", "collections/x.yaml", "keys", "set `keyed: true`"),
    # -- schema and YAML -----------------------------------------------------------------------
    Reject("unknown-key-typo", trig({"write": {"colections": ["main"]}}), "schema.unknown_key", DF,
           "trigger.write.colections", "did you mean `collections`? remove or rename it"),
    Reject("unknown-key-manual", trig({"write": {}, "manual": True}), "schema.unknown_key", DF,
           "trigger.manual", "remove `manual:`"),
    Reject("unknown-key-collection", {"collections/x.yaml": {"name": "x", "keyd": True}},
           "schema.unknown_key", "collections/x.yaml", "keyd", "did you mean `keyed`?"),
    Reject("unknown-key-operator", trig({"write": {"where": {"tags": {"contains": ["a"]}}}}),
           "schema.unknown_key", DF, "trigger.write.where.tags.contains", "remove or rename it"),
    Reject("unknown-key-metric", trig({"accumulator": {"metric": {"scorer": "importance",
                                                                  "agg": "max"},
                                                       "threshold": 1}}),
           "schema.unknown_key", DF, "trigger.accumulator.metric.agg", "allowed here: aggregate"),
    Reject("missing-key", trig({"quiet": {"collections": ["main"]}}), "schema.missing", DF,
           "trigger.quiet.after_s", "add it"),
    Reject("wrong-type-string-number", trig({"quiet": {"after_s": "900"}}), "schema.invalid", DF,
           "trigger.quiet.after_s", "write numbers without quotes"),
    Reject("wrong-literal", {DF: merged(D, source={"collections": ["main"], "mode": "stream"})},
           "schema.invalid", DF, "source.mode", "use one of the listed values"),
    Reject("bare-read", trig({"read": None}), "schema.invalid", DF, "trigger.read",
           "write `read: true`"),
    Reject("not-mapping", {"triggers/x.yaml": "- a\n- b\n"}, "schema.not_mapping",
           "triggers/x.yaml", "", "write `name: ...`"),
    Reject("on-trap", trig(None, **{DF: """\
        name: p2
        function: mod:fn
        source: {collections: [profiles]}
        trigger:
          changed:
            on: [added]
        """}), "yaml.on_trap", DF, "trigger.changed.on", "write `transitions:` instead"),
    Reject("on-trap-yes", {"collections/x.yaml": "name: x\nyes: 1\n"}, "yaml.on_trap",
           "collections/x.yaml", "yes", "quote the key"),
    Reject("yaml-unreadable", {"triggers/x.yaml": "name: x\nprocessor: d\n  read: true\n"},
           "yaml.unreadable", "triggers/x.yaml", "", "fix the syntax near line 3"),
    Reject("yaml-unclosed", {"triggers/x.yaml": "name: [x\n"}, "yaml.unreadable",
           "triggers/x.yaml", "", "fix the syntax"),
    Reject("yaml-two-documents", {"triggers/x.yaml": "name: x\n---\nname: y\n"}, "yaml.unreadable",
           "triggers/x.yaml", "", "exactly one YAML document"),
    Reject("yaml-duplicate-key", {"triggers/x.yaml": "name: x\nprocessor: d\nread: true\n"
                                                     "read: false\n"},
           "yaml.duplicate_key", "triggers/x.yaml", "read", "keep one of them"),
    # -- graph.cycle -----------------------------------------------------------------------------
    Reject("cycle-self", trig({"write": {}}, merged(D, emits=["main"])), "graph.cycle", DF,
           "trigger.write.collections", "break the cycle"),
    Reject("cycle-two", {
        "collections/x.yaml": {"name": "x"}, "collections/y.yaml": {"name": "y"},
        "derivations/a.yaml": {"name": "a", "function": "mod:fn", "source": {"collections": ["y"]},
                               "emits": ["x"], "trigger": {"write": {}}},
        "derivations/b.yaml": {"name": "b", "function": "mod:fn", "source": {"collections": ["x"]},
                               "emits": ["y"], "trigger": {"write": {}}},
    }, "graph.cycle", "derivations/a.yaml", "trigger.write.collections", "a → b → a"),
    Reject("cycle-via-census", {
        "collections/x.yaml": {"name": "x"},
        "derivations/a.yaml": {"name": "a", "function": "mod:fn",
                               "source": {"collections": ["main"]}, "emits": ["x"],
                               "trigger": {"census": {"collections": ["x"], "threshold": 2}}},
    }, "graph.cycle", "derivations/a.yaml", "trigger.census.collections", "narrowing the scope"),
    Reject("cycle-via-accumulator-standalone", {
        DF: merged(D, emits=["main"], trigger=None),
        **standalone("d.acc", {"accumulator": {"metric": "count", "threshold": 10}}),
    }, "graph.cycle", "triggers/d.acc.yaml", "accumulator", "d → d"),
]

ACCEPT = [
    Accept("enrichers-for-scorer-and-annotator",
           {"collections/main.yaml": merged(MAIN, enrichers={"importance": "mod:fn",
                                                             "sentiment_v1": "mod:fn"})}),
    Accept("read-with-cooldown", trig({"read": True, "cooldown_s": 60})),
    Accept("bare-write-enables-defaults", trig({"write": None})),
    Accept("cron-valid", trig({"cron": {"expr": "0 3 * * *"}})),
    Accept("cron-macro", trig({"cron": {"expr": "@daily", "entities": "any"}})),
    Accept("cron-steps", trig({"cron": {"expr": "*/15 9-17 * * mon-fri"}})),
    Accept("subset-narrower-types", trig({"write": {"types": ["chat"], "statuses": ["active"]}})),
    Accept("subset-explicit-active-version", trig({"write": {"collections": ["main@2"]}})),
    Accept("subset-both-versions", btrig({"write": {"collections": ["main@1"]}})),
    Accept("observational-census-any-collection",
           trig({"census": {"collections": ["notes"], "types": ["summary"], "threshold": 3}})),
    Accept("observational-at-any-collection",
           trig({"at": {"collections": ["notes"], "field": "due", "offset_s": -60}})),
    Accept("changed-on-keyed", ptrig({"changed": {"keys": ["role"],
                                                  "transitions": ["added", "changed"]}})),
    Accept("retraction-on-keyed", ptrig({"retraction": {"keyed": True}})),
    Accept("where-every-operator", trig({"write": {"where": {
        "session_id": {"exists": True, "in": ["a", "b"], "gte": "a", "lt": "z"},
        "tags": {"contains_any": ["x"], "contains_all": ["x", "y"]},
        "score": {"gt": 0.5, "lte": 10},
        "count": {"eq": 3},
        "flag": {"eq": False},
        "when": {"gte": "2026-01-01T00:00:00Z"},
        "valence": {"lte": -0.5},
        "nested": {"eq": "deep"},
    }}})),
    Accept("where-array-eq", trig({"write": {"where": {"tags": {"eq": ["a", "b"]}}}})),
    Accept("where-across-versions-same-type",
           btrig({"write": {"where": {"session_id": {"eq": "s"}}}})),
    Accept("where-on-every-scoped-kind", trig({
        "write": {"where": {"tags": {"contains_any": ["a"]}}},
        "quiet": {"after_s": 1, "where": {"session_id": {"exists": True}}},
        "census": {"collections": ["notes"], "threshold": 1, "where": {"topic": {"eq": "x"}}},
        "at": {"field": "when", "where": {"flag": {"eq": True}}},
    })),
    Accept("where-on-changed-retraction", ptrig({
        "changed": {"where": {"title": {"exists": True}}},
        "retraction": {"where": {"due": {"lt": "2030-01-01T00:00:00+02:00"}}},
    })),
    Accept("at-annotation-backed-required", trig({"at": {"field": "seen_at", "offset_s": 3600}})),
    Accept("acc-count", trig({"accumulator": {"metric": "count", "threshold": 50}})),
    Accept("acc-scorer-shorthand", trig({"accumulator": {"metric": "importance",
                                                         "threshold": 100}})),
    Accept("acc-scorer-max", trig({"accumulator": {"metric": {"scorer": "importance",
                                                              "aggregate": "max"},
                                                   "threshold": 9}})),
    Accept("acc-annotation-avg-lte", trig({"accumulator": {
        "metric": {"annotation": "sentiment_v1", "path": "valence", "aggregate": "avg"},
        "threshold": -0.25, "comparison": "lte"}})),
    Accept("acc-non-numeric-leaf-distinct-count", trig({"accumulator": {
        "metric": {"annotation": "sentiment_v1", "path": "label", "aggregate": "distinct_count"},
        "threshold": 3}})),
    Accept("acc-lte-any-finite", trig({"accumulator": {"metric": "count", "threshold": 0,
                                                       "comparison": "lte"}})),
    Accept("acc-window", trig({"accumulator": {"metric": "count", "threshold": 50,
                                               "window": {"size_s": 600, "hop_s": 60}}})),
    Accept("census-window", trig({"census": {"threshold": 3, "window": {"size_s": 86400}}})),
    Accept("lifecycle-first-record", trig({"lifecycle": {"first_record": True}})),
    Accept("lifecycle-total", trig({"lifecycle": {"total_records": 500}})),
    Accept("durations-at-bounds", trig({"quiet": {"after_s": 1, "max_wait_s": 604800},
                                        "write": {}, "debounce_s": 604800, "max_wait_s": 604800,
                                        "cooldown_s": 1})),
    Accept("debounce-with-data", trig({"write": {}, "debounce_s": 30, "max_wait_s": 300})),
    Accept("standalone-processor", standalone("d.nightly", {"cron": {"expr": "0 3 * * *"}})),
    Accept("standalone-derivation-alias",
           {"triggers/x.yaml": {"name": "x", "derivation": "d", "read": True}}),
    Accept("standalone-pipeline-alias",
           {"triggers/x.yaml": {"name": "x", "pipeline": "d", "read": True}}),
    Accept("standalone-named-default-without-inline",
           {DF: merged(D, trigger=None), **standalone("d.default", {"read": True})}),
    Accept("quoted-on-value", {"collections/x.yaml": 'name: x\ndescription: "on"\n'}),
    Accept("chain-without-cycle", {
        "collections/x.yaml": {"name": "x", "keyed": True},
        "collections/y.yaml": {"name": "y"},
        "derivations/a.yaml": {"name": "a", "function": "mod:fn",
                               "source": {"collections": ["main"]}, "emits": ["x"],
                               "trigger": {"write": {}}},
        "derivations/b.yaml": {"name": "b", "function": "mod:fn", "source": {"collections": ["x"]},
                               "emits": ["y"], "trigger": {"changed": {}}},
    }),
    Accept("self-emission-with-read-and-cron-only",
           trig({"read": True, "cron": {"expr": "@hourly"}}, merged(D, emits=["main"]))),
    Accept("collection-single-version-shorthand",
           {"collections/x.yaml": {"name": "x", "fields": {"a": "string"}}}),
    Accept("collection-explicit-active-version", {"collections/x.yaml": {
        "name": "x", "active_version": 1, "versions": [{"version": 1}, {"version": 2}]}}),
    Accept("unquoted-yaml-timestamp", {"triggers/x.yaml": """\
        name: x
        processor: d
        write:
          where:
            when: {gte: 2026-01-01T00:00:00Z, lt: 2027-01-01T00:00:00+02:00}
        """}),
    Accept("yaml-anchors", {"triggers/x.yaml": """\
        name: x
        processor: d
        write: &scope {collections: [main], types: [chat]}
        quiet:
          <<: *scope
          after_s: 900
        """}),
]


@pytest.mark.parametrize("case", REJECT, ids=[c.id for c in REJECT])
def test_rejects(tmp_path: Any, case: Reject) -> None:
    result = build(tmp_path, case.overrides)
    assert result.catalog is None
    only(result, case.code)
    at = [i for i in result.issues if (i.code, i.file, i.path) == (case.code, case.file, case.path)]
    assert at, "\n".join(i.format() for i in result.issues)
    assert case.fix in at[0].message, at[0].format()


@pytest.mark.parametrize("case", ACCEPT, ids=[c.id for c in ACCEPT])
def test_accepts(tmp_path: Any, case: Accept) -> None:
    assert_ok(build(tmp_path, case.overrides))


def test_every_documented_code_has_a_rejecting_case() -> None:
    from wakeline.catalog import errors

    documented = {
        line.split()[0]
        for line in (errors.__doc__ or "").splitlines()
        if line.startswith("      ") and "." in (line.split() or [""])[0]
    }
    runtime_only = {"function.unresolved", "catalog.empty", "at.changes_source"}
    tested = {c.code for c in REJECT}
    assert documented - tested - runtime_only == set()
    assert tested <= documented


def test_all_issues_are_collected_not_just_the_first(tmp_path: Any) -> None:
    result = build(tmp_path, {
        **trig({"quiet": {"after_s": 0}, "cron": {"expr": "bad"},
                "accumulator": {"metric": "nope", "threshold": -1}}),
        **standalone("x", {"read": True}, "missing"),
    })
    codes = sorted(i.code for i in result.issues)
    assert codes == sorted([
        "duration.range", "cron.invalid", "accumulator.unknown_scorer", "accumulator.threshold",
        "trigger.unknown_derivation",
    ])


def test_cycles_are_reported_alongside_other_issues(tmp_path: Any) -> None:
    result = build(tmp_path, {
        **trig({"write": {}}, merged(D, emits=["main"])),
        **standalone("x", {"cron": {"expr": "bad"}}),
    })
    assert sorted(i.code for i in result.issues) == ["cron.invalid", "graph.cycle"]


def test_naive_unquoted_yaml_timestamp_is_rejected(tmp_path: Any) -> None:
    result = build(tmp_path, {"triggers/x.yaml": "name: x\nprocessor: d\nwrite:\n  where:\n"
                                                 "    when: {gte: 2026-01-01 10:00:00}\n"})
    issue = only(result, "where.incompatible")
    assert issue.path == "write.where.when.gte" and "has no timezone" in issue.message
    dated = build(tmp_path / "date", {"triggers/x.yaml": "name: x\nprocessor: d\nwrite:\n"
                                                         "  where:\n    when: {gte: 2026-01-01}\n"})
    assert "2026-01-01T00:00:00Z" in only(dated, "where.incompatible").message


def test_issue_lines_point_at_the_yaml(tmp_path: Any) -> None:
    result = build(tmp_path, {DF: """\
        name: d
        function: mod:fn
        source: {collections: [main]}
        trigger:
          quiet:
            after_s: 0
        """})
    issue = only(result, "duration.range")
    assert issue.line == 6
    assert issue.format().startswith(f"{DF}:trigger.quiet.after_s: [duration.range] ")


def test_broken_document_does_not_cascade(tmp_path: Any) -> None:
    """A derivation with a schema error is skipped without 'unknown derivation' noise."""
    result = build(tmp_path, {
        DF: merged(D, timeout="soon"),
        **standalone("d.nightly", {"cron": {"expr": "@daily"}}),
    })
    assert [i.code for i in result.issues] == ["schema.unknown_key"]


def test_function_unresolved_when_importing(tmp_path: Any) -> None:
    ok = build(tmp_path / "ok", resolve_functions=True)
    assert_ok(ok)
    bad = build(tmp_path / "bad", {DF: merged(D, function="mod:missing")}, resolve_functions=True)
    issue = only(bad, "function.unresolved")
    assert (issue.file, issue.path) == (DF, "function")
    assert "define `def missing(ctx)`" in issue.message
    nomod = build(tmp_path / "nomod", {DF: merged(D, function="nomod.x:fn")},
                  resolve_functions=True)
    assert "put nomod/x.py under" in only(nomod, "function.unresolved").message


def test_empty_directory(tmp_path: Any) -> None:
    from wakeline.catalog import check_catalog

    (tmp_path / "empty").mkdir()
    result = check_catalog(tmp_path / "empty")
    assert [i.code for i in result.issues] == ["catalog.empty"]


def test_missing_directory_raises(tmp_path: Any) -> None:
    from wakeline.catalog import CatalogNotFound, compile_catalog

    with pytest.raises(CatalogNotFound) as info:
        compile_catalog(tmp_path / "nope")
    assert info.value.code == "catalog.not_found"


def test_at_on_changes_source_warns(tmp_path: Any) -> None:
    result = build(tmp_path, trig({"at": {"field": "when"}}))
    assert_ok(result)
    assert [w.code for w in result.warnings] == ["at.changes_source"]
    snap = build(tmp_path / "snap", trig({"at": {"field": "when"}}, merged(
        D, source={**D["source"], "mode": "snapshot"})))
    assert snap.warnings == []
