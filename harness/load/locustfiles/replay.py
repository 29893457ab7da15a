"""Open-loop replay of a corpus at trace time: ``locust -f locustfiles/replay.py --corpus … --schedule …``.

Thin on purpose: Locust discovers the user, the shape and (through the import) the event listeners
here; the logic lives in ``harness.load`` (see docs/load.md).
"""

from harness.load.shapes import ReplayShape
from harness.load.user import ReplayUser

__all__ = ["ReplayShape", "ReplayUser"]
