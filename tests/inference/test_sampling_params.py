import pytest

from inference.sampling_params import SamplingParams


def test_defaults_sample_at_temperature_one():
    params = SamplingParams()
    assert params.temperature == 1.0
    assert params.top_k == 0
    assert params.stop == []
    assert not params.is_greedy


def test_temperature_zero_is_greedy():
    assert SamplingParams(temperature=0).is_greedy


def test_stop_lists_are_not_shared():
    a, b = SamplingParams(), SamplingParams()
    a.stop.append("x")
    assert b.stop == []


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_invalid_values_name_the_field(kwargs, field_name):
    with pytest.raises(ValueError, match=field_name):
        SamplingParams(**kwargs)


def test_boundary_values_are_accepted():
    SamplingParams(temperature=0, top_p=1.0, top_k=0, repetition_penalty=0.5, max_tokens=1)
