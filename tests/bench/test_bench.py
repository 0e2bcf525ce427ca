from perf.servertools import metric_delta


def test_metric_delta_per_pool_and_batch_size():
    key = lambda name, **labels: (name, tuple(sorted(labels.items())))  # noqa: E731
    before = {
        key("switchboard_engine_decode_steps_total", model="engine_short"): 10.0,
        key("switchboard_engine_batch_steps_total", model="engine_short", batch_size="2"): 4.0,
    }
    after = {
        key("switchboard_engine_decode_steps_total", model="engine_short"): 25.0,
        key("switchboard_engine_batch_steps_total", model="engine_short", batch_size="2"): 9.0,
        key("switchboard_engine_batch_steps_total", model="engine_short", batch_size="3"): 10.0,
        key("switchboard_engine_decode_steps_total", model="engine_long"): 0.0,
        key("switchboard_engine_waiting", model="engine_short"): 3.0,
    }
    pools = metric_delta(before, after)
    assert pools["engine_short"]["decode_steps"] == 15
    assert pools["engine_short"]["batch_steps"] == {2: 5, 3: 10}
    assert pools["engine_long"] == {"batch_steps": {}, "decode_steps": 0.0}
    assert "waiting" not in pools["engine_short"]
