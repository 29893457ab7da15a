"""The locustfiles, shipped with the package so that ``locust -f`` works from an installed wheel too.

``replay.py`` (open-loop replay) and ``warmup.py`` (the warmup ladder) are what ``locust -f`` loads;
:data:`harness.load.runner.LOCUSTFILES` names them by path. A checkout also has them as
``locustfiles/`` at its root (a link to this directory), the README's ``locust -f locustfiles/replay.py``.
Nothing imports these modules as ``harness.load.locustfiles.*``: Locust loads them by file path.
"""
