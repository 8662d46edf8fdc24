"""Kafka's default partitioner for keyed messages, as the Java client computes it.

``partition = toPositive(murmur2(key)) % partitions`` with Kafka's murmur2 (seed
``0x9747b28c``).  librdkafka's ``murmur2_random`` partitioner is the same
function for non-null keys, which is why the relay's producer sets it: an
entity's events then land on the partition Debezium (a Java producer) would
choose.  This module lets tests and tools compute the partition of a key
without a broker.
"""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` as a signed 32-bit int (Java ``int``)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    full = length & ~3
    for i in range(0, full, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[full + 2] << 16
    if rest >= 2:
        h ^= data[full + 1] << 8
    if rest >= 1:
        h ^= data[full]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition the Java default partitioner picks for ``key``."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    return (murmur2(key) & 0x7FFFFFFF) % partitions
