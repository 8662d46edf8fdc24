"""PostgreSQL store: the schema, its migrations and the writes users need."""

from wakeline.store.migrate import current_version, migrate
from wakeline.store.records import NoLiveHead, Record, RecordNotFound, Store

__all__ = ["NoLiveHead", "Record", "RecordNotFound", "Store", "current_version", "migrate"]
