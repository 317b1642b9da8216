"""The real-server helpers live in the package so the benchmarks can use them too."""

from loadtest.realservers import (  # noqa: F401
    fake_model_server,
    free_port,
    post_json,
    prometheus,
    query,
    stop,
    wait_for_series,
    wait_http,
)
