"""Enrichers of the ``main`` collection: run by the readiness agent before a record
becomes ready.  Each takes the record (a dict, as derivations see them) and
returns a scorer's number or an annotator's annotation.  Deterministic: a tiny
lexicon stands in for the model an application would call.
"""

from __future__ import annotations

from typing import Any

IMPORTANT = {"deadline": 20, "moved": 15, "launch": 12, "remind": 10, "stressed": 10,
             "review": 8, "now a": 15, "not sure": 6}
POSITIVE = {"well", "thanks", "great", "good", "glad", "morning"}
NEGATIVE = {"stressed", "bad", "worried", "not sure", "angry", "sad"}


def importance(record: dict[str, Any]) -> float:
    text = str(record.get("text", "")).lower()
    return float(5 + sum(w for k, w in IMPORTANT.items() if k in text))


def sentiment(record: dict[str, Any]) -> dict[str, Any]:
    text = str(record.get("text", "")).lower()
    pos = sum(1 for w in POSITIVE if w in text)
    neg = sum(1 for w in NEGATIVE if w in text)
    valence = 0.0 if pos == neg else round((pos - neg) / (pos + neg), 2)
    label = "positive" if valence > 0 else "negative" if valence < 0 else "neutral"
    return {"valence": valence, "label": label}
