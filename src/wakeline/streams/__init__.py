"""The streaming topology: Faust agents hosting the pure condition core.

Topics (names and partition counts from the topology):

- ``changes``  — the CDC topic (Debezium envelopes), keyed by (workspace, entity);
- ``stimuli``  — manual runs, reads, ticks, cron fires, re-evaluations; same key;
- ``derive``   — jobs leaving the mailbox; same key;
- ``cron``     — durable cron scan pages (one message per page of 500 entities).

``changes`` and ``stimuli`` are co-partitioned and consumed by one conditions
agent whose table holds each entity's :class:`~wakeline.core.state.EntityState`
(its mailboxes included), so every event about an entity is applied in one
place, in order.
"""
