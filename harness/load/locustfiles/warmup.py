"""The staged warmup ladder with rollback::

    locust -f locustfiles/warmup.py --headless --host http://127.0.0.1:8000 \\
        --corpus runs/corpus --plan fixtures/plans/tiny.yaml --out runs/ladder

Our options (``--corpus``, ``--plan``, ``--preload``, ``--out`` …) are not in
``locust -f locustfiles/warmup.py --help``: Locust prints its help before it loads a locustfile, so
none can add to it. ``harness load ladder --help`` lists them (the same options, from one model), and
docs/load.md explains them.

Thin on purpose: Locust discovers the user, the ladder shape and (through the import) the event
listeners here; the logic lives in ``harness.load`` (see docs/load.md).
"""

from harness.load.shapes import LadderShape
from harness.load.user import ReplayUser

__all__ = ["LadderShape", "ReplayUser"]
