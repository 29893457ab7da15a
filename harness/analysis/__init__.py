"""The analysis stage: how to warm a cache well, and why cold starts hurt.

* :mod:`~harness.analysis.references`, :mod:`~harness.analysis.sim`: request histories as reference
  sequences; Belady (MIN), LRU and LFU simulators (``harness analysis hitrate``).
* :mod:`~harness.analysis.warmup`: reuse prediction, preload set, preload JSONL, ladder plan
  (``harness analysis plan``).
* :mod:`~harness.analysis.tiers`: hot-zone tiers → the cache's tier policy file (``tiers``).
* :mod:`~harness.analysis.decay`: QPS decay under cache misses (``decay``).
* :mod:`~harness.analysis.avalanche`: avalanche probability and RTO (``avalanche``, ``rto``).
* :mod:`~harness.analysis.index_warmup`: FAISS index save/load/reconstruct timing (``index``).
* :mod:`~harness.analysis.gpu_frag`: CUDA fragmentation vs H2D throughput (``gpu-frag``).
* :mod:`~harness.analysis.anomaly`: anomaly attribution tree from metrics (``scrape``, ``anomaly``).
* :mod:`~harness.analysis.deploy`: Grafana dashboard and Istio routing (``harness deploy``).
"""
