"""The HTTP API and the lag dashboard (an ASGI app; ``wakeline api`` serves it).

    >>> from wakeline.api import ApiContext, create_app          # doctest: +SKIP
    >>> app = create_app(ApiContext(topology, catalog, dsn, bootstrap,
    ...                             settings=load_settings("api.yaml")))

Layout: :mod:`~wakeline.api.config` (operator settings, tokens),
:mod:`~wakeline.api.auth`, :mod:`~wakeline.api.errors`, :mod:`~wakeline.api.models`,
:mod:`~wakeline.api.mailbox` (request/reply with the conditions agent),
:mod:`~wakeline.api.rows` (reads from PostgreSQL), :mod:`~wakeline.api.ops` and
:mod:`~wakeline.api.state_view` (lag, slots, mailbox panels), one router per group
under :mod:`~wakeline.api.routes`, and :mod:`~wakeline.api.server` (uvicorn).
"""

from wakeline.api.app import create_app
from wakeline.api.config import ApiSettings, load_settings
from wakeline.api.context import ApiContext
from wakeline.api.server import ApiServer

__all__ = ["ApiContext", "ApiServer", "ApiSettings", "create_app", "load_settings"]
