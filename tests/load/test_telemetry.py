"""The target's telemetry (harness.load.telemetry, harness.load.server_metrics): exposition text of
each server kind parsed and normalised, counter deltas per phase, NVML where there is a GPU.

The exposition samples are written from each project's documentation, in the form its server prints
(names, types, labels); the source is noted above each. The live scrape of our own server is checked
in tests/load/test_tiny_server.py, the target without /metrics in tests/load/test_replay.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.load.server_metrics import (
    SERVER_KINDS,
    SERVER_METRICS_FILE,
    SampleWriter,
    ServerSample,
    UnknownServer,
    counter_delta,
    detect_kind,
    normalise,
    phase_of,
    read_server_metrics,
    run_phases,
)
from harness.load.telemetry import Nvml

# vLLM V1, https://docs.vllm.ai/en/v0.32.0/usage/metrics/ (and docs/design/metrics.md): counters in
# tokens, kv_cache_usage_perc a share 0-1, one label set per model (two engines here: data parallel).
VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="SmolLM2"} 3.0
vllm:num_requests_running{engine="1",model_name="SmolLM2"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="SmolLM2"} 1.0
vllm:num_requests_waiting{engine="1",model_name="SmolLM2"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="SmolLM2"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="SmolLM2"} 0.75
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="SmolLM2"} 1100.0
vllm:prefix_cache_queries_total{engine="1",model_name="SmolLM2"} 900.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="SmolLM2"} 512.0
vllm:prefix_cache_hits_total{engine="1",model_name="SmolLM2"} 256.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="SmolLM2"} 1100.0
vllm:prompt_tokens_total{engine="1",model_name="SmolLM2"} 900.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="SmolLM2"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="SmolLM2"} 9.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="SmolLM2"} 9.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="SmolLM2"} 2.5
"""

# SGLang, https://docs.sglang.io/references/production_metrics.html (--enable-metrics): the radix
# cache's hits as cached_tokens_total by cache_source, prompt tokens, queue and token usage.
SGLANG = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
# HELP sglang:cached_tokens_total Number of cached prompt tokens.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0e+06
sglang:cached_tokens_total{cache_source="host",model_name="meta-llama/Llama-3.1-8B-Instruct"} 64902.0
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:cache_hit_rate The cache hit rate
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.007507552643049313
# HELP sglang:num_running_reqs The number of running requests
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 162.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2826.0
"""

# llama.cpp, tools/server/README.md "GET /metrics" (llama-server --metrics): no labels, no prefix
# counters (prompt_tokens_total counts the tokens evaluated, not those looked up).
LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 3469
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.125
# HELP llamacpp:kv_cache_tokens KV-cache tokens.
# TYPE llamacpp:kv_cache_tokens gauge
llamacpp:kv_cache_tokens 1024
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"""

# TGI, https://huggingface.co/docs/text-generation-inference/reference/metrics: queue and batch sizes.
TGI = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 4
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 8
# TYPE tgi_request_count counter
tgi_request_count 120
"""


def test_vllm_label_sets_are_summed_and_kv_usage_averaged() -> None:
    s = normalise(VLLM, 1.5)
    assert s.kind == "vllm" and s.t_s == 1.5
    assert (s.prefix_queries, s.prefix_hits, s.running, s.waiting) == (2000.0, 768.0, 5.0, 1.0)
    assert s.kv_usage == pytest.approx(0.5)  # a share per engine: averaged, never summed past 1
    assert s.raw["vllm:prompt_tokens_total"] == 2000.0
    assert not any("time_to_first_token" in k for k in s.raw)  # histograms are not kept


def test_vllm_before_the_rename_is_read_too() -> None:
    old = VLLM.replace("vllm:prefix_cache_", "vllm:gpu_prefix_cache_").replace(
        "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"
    )
    s = normalise(old, 0.0)
    assert (s.prefix_queries, s.prefix_hits, s.kv_usage) == (2000.0, 768.0, pytest.approx(0.5))


def test_sglang_hits_from_every_cache_source() -> None:
    s = normalise(SGLANG, 0.0)
    assert s.kind == "sglang" and s.prefix_queries == 8.128902e06 and s.prefix_hits == 4.0e06 + 64902.0
    assert (s.running, s.waiting, s.kv_usage) == (162.0, 2826.0, 0.28)
    assert s.raw["sglang:cache_hit_rate"] == pytest.approx(0.0075, abs=1e-4)


def test_llamacpp_and_tgi_have_no_prefix_counters() -> None:
    s = normalise(LLAMACPP, 0.0)
    assert s.kind == "llamacpp" and (s.running, s.waiting, s.kv_usage) == (2.0, 1.0, 0.125)
    assert s.prefix_queries is None and s.prefix_hits is None
    assert s.raw["llamacpp:prompt_tokens_total"] == 6886.0
    t = normalise(TGI, 0.0)
    assert t.kind == "tgi" and (t.running, t.waiting, t.kv_usage) == (8.0, 4.0, None)


def test_our_server_is_detected_first_and_unknown_names_are_refused() -> None:
    ours = '# TYPE harness_engine_running_requests gauge\nharness_engine_running_requests{device="cpu"} 1\n'
    assert normalise(ours + VLLM, 0.0).kind == "harness"  # registry order decides
    assert detect_kind(["up", "process_cpu_seconds_total"]) is None
    with pytest.raises(UnknownServer, match="none of the known servers' names"):
        normalise("# TYPE up gauge\nup 1\n", 0.0)
    with pytest.raises(UnknownServer):  # a login page where /metrics should be
        normalise("<html>not metrics</html>\n", 0.0)
    with pytest.raises(ValueError):  # a wanted sample that is not one
        normalise('vllm:num_requests_running{model_name="m"} lots\n', 0.0)
    assert {"harness", "vllm", "sglang", "llamacpp", "tgi"} <= set(SERVER_KINDS.names())


def test_our_servers_series_are_kept_per_label_set(tmp_path: Path) -> None:
    """What harness analysis anomaly reads: the cache's and the handlers' series with their labels
    (a NaN gauge left out: it says nothing, and JSON has no NaN); other kinds keep none."""
    ours = (
        '# TYPE harness_engine_running_requests gauge\nharness_engine_running_requests{device="cpu"} 1\n'
        '# TYPE cache_hit_rate gauge\ncache_hit_rate{tier="l1"} 0.25\ncache_hit_rate{tier="l2"} NaN\n'
        "# TYPE cache_evictions counter\n"
        'cache_evictions_total{tier="l1"} 3.0\ncache_evictions_created{tier="l1"} 1.7e+09\n'
    )
    s = normalise(ours, 2.0)
    assert [(v.name, v.labels, v.value) for v in s.series] == [
        ("cache_hit_rate", {"tier": "l1"}, 0.25),
        ("cache_evictions_total", {"tier": "l1"}, 3.0),
    ]
    assert normalise(VLLM, 0.0).series == []
    writer = SampleWriter(tmp_path / SERVER_METRICS_FILE)
    writer.write(s)
    writer.write(normalise(VLLM, 1.0))
    writer.close()
    lines = (tmp_path / SERVER_METRICS_FILE).read_text().splitlines()
    assert '"series":[{"name":"cache_hit_rate"' in lines[0] and "series" not in lines[1]
    first, _ = read_server_metrics(tmp_path)
    assert first == s


def test_counter_deltas_handle_phases_and_resets() -> None:
    pts = [(-0.5, 100.0), (1.0, 150.0), (2.0, 180.0), (3.0, 20.0), (4.0, 50.0)]  # reset before 3.0
    assert counter_delta(pts, -math.inf, math.inf) == 50 + 30 + 20 + 30
    assert counter_delta(pts, 1.0, 2.0) == 30.0
    assert counter_delta(pts, 1.5, 2.5) == 30.0  # from the last scrape at or before the start
    assert counter_delta(pts, 5.0, 9.0) is None  # nothing after the start
    assert counter_delta([], 0, 1) is None


def test_phase_of_a_ladder(tmp_path: Path) -> None:
    samples = [
        ServerSample(t_s=t, kind="vllm", prefix_queries=q, prefix_hits=h, running=r, kv_usage=k)
        for t, q, h, r, k in (
            (-1, 0, 0, 0, 0.0),
            (1, 100, 10, 2, 0.1),
            (2, 200, 60, 5, 0.4),
            (3, 300, 150, 1, 0.2),
        )
    ]
    phases = run_phases("replay", [("a", 0.0, 1.5), ("b", 1.5, 2.5)])
    assert phases == [("a", 0.0, 1.5), ("b", 1.5, math.inf)]  # the last one open-ended
    a, b = (phase_of(samples, *p) for p in phases)
    assert (a.prefix_queries, a.prefix_hits, a.prefix_hit_rate) == (100, 10, 0.1)
    assert (b.prefix_queries, b.prefix_hits, b.running_max, b.kv_usage_max) == (200, 140, 5, 0.4)
    assert b.ended_s is None and b.prefix_hit_rate == pytest.approx(0.7)
    assert run_phases("warm", None) == [("warm", -math.inf, math.inf)]
    f = tmp_path / "server_metrics.jsonl"
    f.write_text("".join(s.model_dump_json() + "\n" for s in samples) + '{"t_s": 4, "error": "x"}\n')
    back = list(read_server_metrics(tmp_path))
    assert back[:4] == samples and back[4].error == "x"


def test_a_scrape_is_stamped_when_its_answer_arrived(tmp_path: Path) -> None:
    """The server reads its counters somewhere between the GET and the answer. Stamped at the answer,
    a stage that ended before it cannot be given what happened after its end, however slow the scrape
    (stamped at the GET, one that took 300 ms across a stage boundary gave the earlier stage the next
    stage's hits)."""
    from harness.common.auth import Credentials
    from harness.load.telemetry import Scraper

    clock = [2.9]
    scraper = Scraper("http://127.0.0.1:9", Credentials(), tmp_path / SERVER_METRICS_FILE, interval_s=1.0,
                      now=lambda: clock[0],
                      warn=lambda _: None)  # fmt: skip
    before = VLLM.replace("} 512.0", "} 0.0").replace("} 256.0", "} 0.0")  # no hit yet
    answers = iter([(0.0, before), (0.3, VLLM)])

    def slow_get() -> tuple[int, bytes]:
        took, text = next(answers)
        clock[0] += took  # the GET went out at clock[0]; its answer arrives this much later
        return 200, text.encode()

    scraper._get = slow_get  # type: ignore[method-assign]
    clock[0] = -0.5
    scraper.scrape()  # the baseline before the epoch
    clock[0] = 2.9
    scraper.scrape()  # sent before the stage boundary at 3.0, answered after it
    scraper.writer.close()
    assert [s.t_s for s in scraper.samples] == [-0.5, 3.2]
    assert scraper.samples[1].prefix_hits == 768.0
    # The hits it saw may have come after 3.0: the low stage has no scrape that could hold them.
    assert phase_of(scraper.samples, "low", 0.0, 3.0).prefix_hits is None
    assert phase_of(scraper.samples, "high", 3.0, 4.0).prefix_hits == 768.0


@pytest.mark.gpu
def test_nvml_samples_the_local_gpus() -> None:
    nvml = Nvml()
    if not nvml.available:
        pytest.skip(f"needs a GPU through NVML: {nvml.why}")
    try:
        (first, *_) = nvml.sample()
        assert 0 < first.memory_used_bytes <= first.memory_total_bytes
        assert first.utilization_pct is None or 0 <= first.utilization_pct <= 100
        assert first.power_w is None or first.power_w > 0
        assert first.name
    finally:
        nvml.close()
