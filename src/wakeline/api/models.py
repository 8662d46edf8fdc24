"""Request and response bodies (pydantic).  Strings and JSON values are checked
before they reach PostgreSQL: no NUL characters, valid Unicode, bounded sizes —
so bad input answers 422, never a database error."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

MAX_BIGINT = 2**63 - 1
MAX_DEPTH = 32


def _clean_str(v: str) -> str:
    if "\x00" in v:
        raise ValueError("must not contain NUL characters")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("must be valid Unicode (no lone surrogates)") from exc
    return v


def _clean_json(v: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(v, str):
        return _clean_str(v)
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        if abs(v) > MAX_BIGINT:
            raise ValueError("integers must fit in 64 bits")
        return v
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError("numbers must be finite")
        return v
    if isinstance(v, list):
        return [_clean_json(x, depth + 1) for x in v]
    if isinstance(v, dict):
        return {_clean_str(str(k)): _clean_json(x, depth + 1) for k, x in v.items()}
    raise ValueError(f"not a JSON value: {type(v).__name__}")


def _aware(v: datetime | None) -> datetime | None:
    if v is None:
        return v
    if v.tzinfo is None:
        raise ValueError("an instant needs a timezone (e.g. '2026-07-19T09:00:00Z')")
    try:
        u = v.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError("instant out of range") from exc
    if not 1970 <= u.year <= 9998:
        raise ValueError("instant out of range (years 1970-9998)")
    return u


Text = Annotated[str, Field(max_length=100_000), AfterValidator(_clean_str)]
Name = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_clean_str)]
Entity = Annotated[str, Field(min_length=1, max_length=512), AfterValidator(_clean_str)]
#: Job ids embed workspace, derivation and entity.
JobId = Annotated[str, Field(min_length=1, max_length=2048), AfterValidator(_clean_str)]
ShortStr = Annotated[str, Field(max_length=256), AfterValidator(_clean_str)]
Seq = Annotated[int, Field(ge=1, le=MAX_BIGINT)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_clean_json)]
Instant = Annotated[datetime, AfterValidator(_aware)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RecordIn(_In):
    """A record to insert.  ``ready: true`` makes it trigger-visible at once; otherwise
    it waits for enrichment (or ``POST /records/ready``)."""

    entity: Entity
    collection: Name
    type: ShortStr = ""
    status: Name = "active"
    key: Name | None = None
    content: JsonObject = Field(default_factory=dict)
    text: Text = ""
    parents: list[Seq] = Field(default_factory=list, max_length=1000)
    annotations: JsonObject = Field(default_factory=dict)
    scores: JsonObject = Field(default_factory=dict)
    ready: bool = False
    collection_version: int | None = Field(default=None, ge=1, le=1_000_000)
    workspace: Name | None = None


class RecordBatchIn(_In):
    records: list[RecordIn] = Field(min_length=1, max_length=1000)
    workspace: Name | None = None


class MarkReadyIn(_In):
    seqs: list[Seq] = Field(min_length=1, max_length=1000)
    annotations: dict[Seq, JsonObject] = Field(default_factory=dict)
    scores: dict[Seq, JsonObject] = Field(default_factory=dict)
    workspace: Name | None = None


class RetractIn(_In):
    entity: Entity
    collection: Name
    key: Name
    workspace: Name | None = None


class ManualRunIn(_In):
    entity: Entity
    run_after: Instant | None = None
    workspace: Name | None = None


class PauseIn(_In):
    until: Instant | None = None
    reason: Annotated[str, Field(min_length=1, max_length=500),
                      AfterValidator(_clean_str)] = "operator"
    workspace: Name | None = None


class ResumeIn(_In):
    workspace: Name | None = None


# -- responses -----------------------------------------------------------------


class InsertedOut(BaseModel):
    seq: int


class InsertedBatchOut(BaseModel):
    seqs: list[int]


class ReadyOut(BaseModel):
    ready: list[int] = Field(description="seqs this call made ready")
    already_ready: list[int]


class Freshness(BaseModel):
    """One read-triggered derivation's freshness, exactly as seed 000 shows it."""

    derivation: str
    last_run_at: str | None
    watermark: int
    dirty: bool
    pending_unready: bool
    job: Literal["enqueued", "coalesced", "queued", "running", "dead"] | None
    error_kind: str | None


class Belief(BaseModel):
    seq: int
    type: str
    content: dict[str, Any]
    text: str
    created_at: str | None


class DocumentOut(BaseModel):
    workspace: str
    entity: str
    as_of: str | None
    document: dict[str, dict[str, Belief]] = Field(
        description="current keyed values per collection and key (tombstoned keys omitted)")
    freshness: list[Freshness]
    freshness_source: Literal["conditions", "store", "none"] = Field(
        description="conditions: the agent's mailbox answered; store: it did not answer in "
                    "time and freshness was computed from PostgreSQL (the read stimulus is "
                    "in the log and will still be applied)")
    jobs: dict[str, str] = Field(default_factory=dict,
                                 description="derivation -> job id the read enqueued or joined")
    request_id: str | None


class RunOut(BaseModel):
    run_id: int
    job_id: str
    attempt: int
    workspace: str
    derivation: str
    entity: str
    trigger_reasons: list[str]
    definition_hashes: dict[str, Any]
    outcome: str
    started_at: str | None
    finished_at: str | None
    duration_s: float
    watermark_before: int
    watermark_after: int
    records_consumed: int
    error: str | None
    error_kind: str | None


class RunsPage(BaseModel):
    runs: list[RunOut]
    next_before: int | None = Field(description="pass as ?before= for the next page")


class JobOut(BaseModel):
    job_id: str
    workspace: str
    derivation: str
    entity: str
    state: Literal["queued", "running", "retrying", "succeeded", "noop", "failed", "dead"]
    reasons: list[str]
    run_after: str | None
    attempts: int
    last_error: str | None = None
    error_kind: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    runs: list[int] = Field(default_factory=list)
    settle: list[str] = Field(default_factory=list,
                              description="settle-style reasons (quiet, debounce) of a queued job")
    reason_times: dict[str, str | None] | None = Field(
        default=None, description="each reason's permitted instant (a job in the mailbox)")
    source: Literal["store", "mailbox"] = Field(
        description="store: the jobs table (claimed by a derive worker); mailbox: still in "
                    "the conditions agent's mailbox")


class ManualRunOut(BaseModel):
    status: Literal["enqueued", "coalesced", "pending"]
    job_id: str | None
    coalesced: bool | None
    run_after: str | None
    derivation: str
    entity: str
    request_id: str


class RequestOut(BaseModel):
    request_id: str
    kind: str
    entity: str
    reply: dict[str, Any]


class PauseOut(BaseModel):
    trigger: str
    paused: bool
    reason: str | None = None
    until: str | None = None
    paused_at: str | None = None
    was_paused: bool | None = None


class ExplainOut(BaseModel):
    trigger: str
    derivation: str
    entity: str
    now: str | None
    conditions: list[dict[str, Any]]
    cooldown_s: float | None
    debounce_s: float | None
    paused: PauseOut | None
    cursor: dict[str, Any] | None
    mailbox: dict[str, Any] | None
    last_run: RunOut | None
    last_outcomes: list[dict[str, Any]]


class TriggersOut(BaseModel):
    catalog_hash: str
    triggers: dict[str, Any]
    paused: dict[str, PauseOut]
