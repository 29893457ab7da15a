"""Experiments: what the harness runs against a target, end to end, and hands to the gates to judge.

A stage above ``load`` (whose Locust runs it launches), the target (whose ``harness serve`` it
starts) and ``gates`` (which judge what it measured); ``gates`` only judges.

- :mod:`~harness.experiments.driver`: a target started from ``--serve-args`` or reached at ``--url``,
  the progress display, ``--out``, SIGTERM as Ctrl-C;
- :mod:`~harness.experiments.phase`: one Locust phase, the one way each of them runs one (launch,
  progress, the exit code's error, the summary read back);
- :mod:`~harness.experiments.target`: the target (its client, :class:`harness.load.target.TargetClient`,
  its model, the ``harness serve`` child started for it) and its cache levels (flush);
- :mod:`~harness.experiments.paired` (``harness run``): flush, cold replay, warm-up, warm check
  (:mod:`~harness.experiments.warmcheck`), warm replay, comparison, gate;
- :mod:`~harness.experiments.capacity` (``harness capacity``): probes at constant rates, each judged
  against an SLO (:mod:`~harness.gates.slo`), the search
  (:mod:`~harness.experiments.capacity_search`), the answer
  (:mod:`~harness.experiments.capacity_result`);
- :mod:`~harness.experiments.ab` (``harness ab``): a base and a candidate target up together, block
  pairs of the same requests interleaved A B B A …, judged on their latency ratio by
  :mod:`harness.gates.ab` (its spec and plan in :mod:`~harness.experiments.ab_spec`, its record
  in :mod:`~harness.experiments.ab_record`);
- :mod:`~harness.experiments.calibrate` (``harness baseline calibrate``): a recipe run N times, the
  baseline they pass by :mod:`harness.gates.calibration`'s rule.
"""
