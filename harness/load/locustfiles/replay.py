"""Open-loop replay of a corpus at trace time::

    locust -f locustfiles/replay.py --headless --host http://127.0.0.1:8000 \\
        --corpus runs/corpus --schedule runs/schedule.jsonl --out runs/replay

Our options (``--corpus``, ``--schedule``, ``--rate``, ``--out`` …) are not in
``locust -f locustfiles/replay.py --help``: Locust prints its help before it loads a locustfile, so
none can add to it. ``harness load replay --help`` lists them (the same options, from one model), and
docs/load.md explains them. Locust's own options (``--host``, ``--headless``, ``--processes`` …) work
as usual.

Thin on purpose: Locust discovers the user, the shape and (through the import) the event listeners
here; the logic lives in ``harness.load`` (see docs/load.md).
"""

from harness.load.shapes import ReplayShape
from harness.load.user import ReplayUser

__all__ = ["ReplayShape", "ReplayUser"]
