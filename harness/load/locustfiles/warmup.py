"""The staged warmup ladder with rollback: ``locust -f locustfiles/warmup.py --corpus … --plan plan.yaml``.

Thin on purpose: Locust discovers the user, the ladder shape and (through the import) the event
listeners here; the logic lives in ``harness.load`` (see docs/load.md).
"""

from harness.load.shapes import LadderShape
from harness.load.user import ReplayUser

__all__ = ["LadderShape", "ReplayUser"]
