"""Request bodies to the session's requests: a refused field is named by the error the check raised."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from exactspec.foundations.errors import InvalidArgument  # noqa: E402
from exactspec.foundations.settings import SamplingSettings  # noqa: E402
from exactspec.server.errors import ApiError  # noqa: E402
from exactspec.server.requests import check_body, text_requests  # noqa: E402
from exactspec.server.schemas import CompletionRequest  # noqa: E402


def refusal(body: CompletionRequest) -> ApiError:
    with pytest.raises(ApiError) as caught:
        text_requests(body)
    return caught.value


def test_a_settings_error_names_its_field_by_the_error_not_its_text(monkeypatch: pytest.MonkeyPatch) -> None:
    body = CompletionRequest(model="m", prompt="a", logit_bias={"abc": 1.0})
    error = refusal(body)
    assert (error.status, error.param) == (400, "logit_bias")
    # A message that does not start with the field still reports the field the check named.
    raised = InvalidArgument("the nucleus must keep some mass", param="top_p")

    def refuse(self: CompletionRequest) -> SamplingSettings:
        raise raised

    monkeypatch.setattr(CompletionRequest, "settings", refuse)
    error = refusal(CompletionRequest(model="m", prompt="a"))
    assert (error.status, error.param, error.message) == (400, "top_p", "the nucleus must keep some mass")


def test_sampling_settings_name_the_field_they_refuse() -> None:
    for field, value in [("temperature", -1.0), ("top_k", -2), ("top_p", 0.0), ("min_p", 2.0)]:
        with pytest.raises(InvalidArgument) as caught:
            SamplingSettings(**{field: value})
        assert caught.value.param == field
    with pytest.raises(InvalidArgument) as caught:
        SamplingSettings(logit_bias={3: float("inf")})
    assert caught.value.param == "logit_bias"


def test_the_body_names_the_served_model_and_a_supported_field() -> None:
    with pytest.raises(ApiError) as caught:
        check_body(CompletionRequest(model="other", prompt="a"), "m")
    assert (caught.value.status, caught.value.param, caught.value.code) == (404, "model", "model_not_found")
    with pytest.raises(ApiError) as caught:
        check_body(CompletionRequest(model="m", prompt="a", echo=True), "m")
    assert (caught.value.status, caught.value.param) == (400, "echo")
    check_body(CompletionRequest(model="m", prompt="a"), "m")  # the served model, nothing unsupported
