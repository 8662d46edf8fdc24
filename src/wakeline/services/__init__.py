"""Services Wakeline runs or connects to: PostgreSQL, Kafka, Tansu, Kafka Connect.

Every service implements :class:`Service` (start / wait_ready / is_ready / stop);
managed ones run as a child process group with a log file and free ports,
external ones only wrap an address. Missing tools raise
:class:`~wakeline.errors.PrerequisiteMissing` with an install hint.

    with PostgresServer(ephemeral=True) as pg, TansuBroker() as broker:
        dsn = pg.create_database("demo")
        ... broker.bootstrap ...
"""

from wakeline.services.base import ExternalService, ProcessService, Service
from wakeline.services.connect import KafkaConnect
from wakeline.services.kafka import ExternalKafka, KafkaBroker
from wakeline.services.maven import KafkaDist, ensure_jars, find_java, find_mvn
from wakeline.services.ports import free_port, free_ports
from wakeline.services.postgres import ExternalPostgres, PostgresServer, dsn_with_database
from wakeline.services.tansu import TansuBroker, find_tansu

__all__ = [
    "ExternalKafka",
    "ExternalPostgres",
    "ExternalService",
    "KafkaBroker",
    "KafkaConnect",
    "KafkaDist",
    "PostgresServer",
    "ProcessService",
    "Service",
    "TansuBroker",
    "dsn_with_database",
    "ensure_jars",
    "find_java",
    "find_mvn",
    "find_tansu",
    "free_port",
    "free_ports",
]
