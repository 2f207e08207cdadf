"""The service rate a backend is measured at, and the waits it predicts."""

from __future__ import annotations

import pytest

from gateway.flow_control.service_rate import ServiceRate, WaitPredictor


def test_no_completion_no_rate_no_prediction() -> None:
    predictor = WaitPredictor(ServiceRate())
    assert predictor.max_ahead(1.0, slots=4) is None
    assert predictor.wait_s(1000, slots=4) is None
    assert predictor.retry_after_s(1000, slots=4) == 1.0


def test_the_rate_is_tokens_per_second_per_slot_times_the_slots() -> None:
    rate = ServiceRate(smoothing=0.5)
    rate.observe(cost=600, held_s=2.0)
    assert rate.per_slot() == 300.0
    rate.observe(cost=200, held_s=2.0)  # averages: 400 tokens over 2 s
    assert rate.per_slot() == 200.0
    assert rate.per_second(slots=3) == 600.0
    assert rate.per_second(slots=0) is None


def test_a_ratio_of_averages_not_an_average_of_ratios() -> None:
    rate = ServiceRate(smoothing=0.5)
    rate.observe(cost=1000, held_s=10.0)  # a long request: 100 tokens/s
    rate.observe(cost=10, held_s=0.01)  # a tiny one: 1000 tokens/s, but it says little
    assert rate.per_slot() == pytest.approx(505 / 5.005)


def test_nothing_is_learnt_from_empty_completions() -> None:
    rate = ServiceRate()
    rate.observe(cost=0, held_s=1.0)
    rate.observe(cost=100, held_s=0.0)
    assert rate.per_slot() is None


def test_predictions() -> None:
    rate = ServiceRate()
    rate.observe(cost=500, held_s=1.0)
    predictor = WaitPredictor(rate)
    assert predictor.max_ahead(2.0, slots=2) == 2000  # 2 slots x 500 tokens/s x 2 s
    assert predictor.wait_s(2500, slots=2) == 2.5
    assert predictor.retry_after_s(2500, slots=2) == 3.0
    assert predictor.retry_after_s(10, slots=2) == 1.0  # at least a second
