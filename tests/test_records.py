from harness.core.records import RequestRecord


def test_json_round_trip_keeps_raw_times():
    r = RequestRecord(
        "x",
        10.0,
        11.0,
        (10.25, 10.5, 11.0),
        (1, 3, 1),
        (5, 6, 7, 8, 9),
        prompt_tokens=7,
        info={"replica": "u"},
    )
    back = RequestRecord.from_json(r.to_json(t0=10.0))
    assert back.ttft == r.ttft and back.e2e == r.e2e
    assert back.itl == r.itl and back.tpot == r.tpot
    assert back.output_token_ids == r.output_token_ids and back.info == {"replica": "u"}


def test_usage_count_overrides_streamed_count():
    r = RequestRecord("x", 0.0, 1.0, (0.5, 1.0), (1, 1), None, usage_output_tokens=5)
    assert r.output_tokens == 5
    assert r.tpot == (1.0 - 0.5) / 4
