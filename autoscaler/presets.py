"""PromQL for each model server, per signal. `$selector` is replaced by the target's label matchers and
`$window` by the rate window (`prometheus.rate_window_s`, one minute by default: at least four scrape
intervals, so a missed scrape does not empty it).

Gateway presets (`GATEWAY_PRESETS`) add what the gateway in front of the servers measures: llm-d's
endpoint picker holds requests in flow control while a pool has no ready endpoint and exports their
number per queue (flow, priority) as `llm_d_epp_flow_control_queue_size` (the older name,
`inference_extension_flow_control_queue_size`, is deprecated); their sum is `held_requests`, the demand
that wakes a model scaled to zero (policies/stages/idle.py). `$gateway_selector` selects the pool's
series (e.g. inference_pool="llama").

Counters are read through rate() over that window, so Prometheus handles counter resets; a series that is
absent gives no sample (never a zero). Every query can be overridden in the config."""

from __future__ import annotations

from string import Template

PRESETS: dict[str, dict[str, str]] = {
    "vllm": {
        "queue_depth": "sum(vllm:num_requests_waiting{$selector})",
        "in_flight": "sum(vllm:num_requests_running{$selector})",
        "p99_latency_s": (
            "histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{$selector}[$window])))"
        ),
        "gpu_memory_headroom_ratio": "1 - avg(vllm:kv_cache_usage_perc{$selector})",
        "token_rate_per_s": "sum(rate(vllm:generation_tokens_total{$selector}[$window]))",
        "arrival_rate_per_s": (
            "sum(rate(vllm:request_success_total{$selector}[$window]))"
            " + clamp_min(sum(deriv(vllm:num_requests_waiting{$selector}[$window])), 0)"
        ),
        "service_time_s": (
            "sum(rate(vllm:request_inference_time_seconds_sum{$selector}[$window]))"
            " / sum(rate(vllm:request_inference_time_seconds_count{$selector}[$window]))"
        ),
    },
    "sglang": {
        "queue_depth": "sum(sglang:num_queue_reqs{$selector})",
        "in_flight": "sum(sglang:num_running_reqs{$selector})",
        "p99_latency_s": (
            "histogram_quantile(0.99, sum by (le) "
            "(rate(sglang:e2e_request_latency_seconds_bucket{$selector}[$window])))"
        ),
        "gpu_memory_headroom_ratio": "1 - avg(sglang:token_usage{$selector})",
        "token_rate_per_s": "sum(rate(sglang:generation_tokens_total{$selector}[$window]))",
        "arrival_rate_per_s": (
            "sum(rate(sglang:num_requests_total{$selector}[$window]))"
            " + clamp_min(sum(deriv(sglang:num_queue_reqs{$selector}[$window])), 0)"
        ),
    },
    "tgi": {
        "queue_depth": "sum(tgi_queue_size{$selector})",
        "in_flight": "sum(tgi_batch_current_size{$selector})",
        "p99_latency_s": (
            "histogram_quantile(0.99, sum by (le) (rate(tgi_request_duration_bucket{$selector}[$window])))"
        ),
        "token_rate_per_s": "sum(rate(tgi_request_generated_tokens_sum{$selector}[$window]))",
        "arrival_rate_per_s": (
            "sum(rate(tgi_request_count{$selector}[$window]))"
        ),
        "service_time_s": (
            "sum(rate(tgi_request_inference_duration_sum{$selector}[$window]))"
            " / sum(rate(tgi_request_inference_duration_count{$selector}[$window]))"
        ),
    },
    "triton": {
        "queue_depth": "sum(nv_inference_pending_request_count{$selector})",
        "arrival_rate_per_s": "sum(rate(nv_inference_count{$selector}[$window]))",
        "service_time_s": (
            "sum(rate(nv_inference_compute_infer_duration_us{$selector}[$window]))"
            " / sum(rate(nv_inference_exec_count{$selector}[$window])) / 1e6"
        ),
    },
}

GATEWAY_PRESETS: dict[str, dict[str, str]] = {
    "llm-d": {"held_requests": "sum(llm_d_epp_flow_control_queue_size{$gateway_selector})"},
}

# GPU memory from DCGM, for servers without a KV-cache gauge (or to override it).
DCGM_HEADROOM = (
    "sum(DCGM_FI_DEV_FB_FREE{$selector}) / (sum(DCGM_FI_DEV_FB_FREE{$selector}) + sum(DCGM_FI_DEV_FB_USED{$selector}))"
)

# Raw gauges and counters per preset for scraping pods' /metrics directly (no Prometheus): name -> metric.
SCRAPE: dict[str, dict[str, str]] = {
    "vllm": {
        "queue_depth": "vllm:num_requests_waiting",
        "in_flight": "vllm:num_requests_running",
        "kv_usage": "vllm:kv_cache_usage_perc",
        "arrivals_total": "vllm:request_success",
        "service_sum": "vllm:request_inference_time_seconds",
    },
    "sglang": {
        "queue_depth": "sglang:num_queue_reqs",
        "in_flight": "sglang:num_running_reqs",
        "kv_usage": "sglang:token_usage",
        "arrivals_total": "sglang:num_requests",
    },
    "tgi": {
        "queue_depth": "tgi_queue_size", "in_flight": "tgi_batch_current_size", "arrivals_total": "tgi_request_count",
    },
    "triton": {"queue_depth": "nv_inference_pending_request_count", "arrivals_total": "nv_inference_count"},
}


def queries(preset: str, selector: str, overrides: dict[str, str] | None = None, *,
            window_s: float = 60.0, gateway: str | None = None, gateway_selector: str = "") -> dict[str, str]:
    """The PromQL per signal for a preset (and a gateway preset, if any), with the selectors and rate window
    filled in and overrides applied."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model-server preset {preset!r}; choose one of {sorted(PRESETS)}")
    if gateway is not None and gateway not in GATEWAY_PRESETS:
        raise ValueError(f"unknown gateway preset {gateway!r}; choose one of {sorted(GATEWAY_PRESETS)}")
    merged = dict(PRESETS[preset])
    merged.update(GATEWAY_PRESETS[gateway] if gateway is not None else {})
    merged.update(overrides or {})
    window = f"{int(window_s)}s" if window_s == int(window_s) else f"{round(window_s * 1000)}ms"  # PromQL: integers
    return {name: Template(q).safe_substitute(selector=selector, window=window, gateway_selector=gateway_selector)
            for name, q in merged.items() if q}
