"""Admission: the one gate every request of every class passes, and everything it is built from.

Reading order: ``gate.py`` (``Gate``: one limit, two partitions; the only thing the HTTP edge and the
WebSocket session ask for a permit), ``classes.py`` (the traffic classes), ``interactive.py``
(``Admission``: the interactive partition, a permit at once or 503, long jobs in lanes),
``bulk.py`` (the bulk partition: a fair bounded queue granted the room interactive work leaves),
``permits.py`` (``Ticket``: the owned handle a holder moves on or releases) and ``limit/`` (the
limits: fixed, adaptive). Docs: docs/concurrency.md, docs/priority.md, docs/design/limiter.md.
"""

from app.serving.admission.classes import Priority, parse_priority
from app.serving.admission.gate import Gate
from app.serving.admission.interactive import Admission
from app.serving.admission.permits import PermitError, Ticket

__all__ = ["Admission", "Gate", "PermitError", "Priority", "Ticket", "parse_priority"]
