"""What a request can fail with; the worker maps each to a message for the user."""


class EngineError(RuntimeError):
    """A request the engine could not serve."""


class PromptTooLongError(EngineError, ValueError):
    """The prompt (plus at least one new token) does not fit `max_model_len`: the caller's fault,
    not worth a retry."""

    def __init__(self, prompt_tokens: int, max_model_len: int) -> None:
        super().__init__(f"prompt of {prompt_tokens} tokens exceeds max_model_len {max_model_len}")
        self.prompt_tokens, self.max_model_len = prompt_tokens, max_model_len


class RequestFailedError(EngineError):
    """The device failed this request (e.g. out of memory); its blocks were freed and the engine
    went on. Transient: a retry may well succeed."""
