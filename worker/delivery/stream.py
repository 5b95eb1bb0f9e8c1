"""The AI bot channel's delivery: the model's answer written into the bot's stream while it is
generated (``worker.delivery.stream_writer``), and finished with the whole reply."""

from __future__ import annotations

from app.accounting import estimate_completion_tokens, estimate_prompt_tokens
from app.llm import Generation, GenerationParams, LLMBackend
from worker.delivery.stream_writer import StreamWriter

DEADLINE = "deadline"  # a streamed generation stopped at the AI bot stream's time limit


class StreamDelivery:
    streams = True

    def __init__(self, writer: StreamWriter):
        self.writer = writer

    def present(self, reply):
        """The stream's content is Markdown already (WeCom renders it): as composed."""
        return reply

    def expired(self) -> bool:
        # The callback gave up on us at WeCom's deadline and told the employee so.
        return self.writer.finished_already()

    def generate(self, llm: LLMBackend, messages: list[dict], params: GenerationParams) -> Generation:
        return stream_generation(llm, messages, params, self.writer)

    def deliver(self, row, owner: str, user_id: str, kind: str, chunks: list[str], lease) -> dict:
        if not self.writer.finish(chunks[0]):
            return {"failure_reason": "aibot: stream closed by the callback at the deadline"}
        return {}

    def nothing(self) -> None:
        self.writer.finish("")

    def delivered(self, row, user_id: str) -> None:
        pass  # the AI bot's 👍/👎 rides on the stream's feedback id (app.web.aibot_callback)

    def failed(self, row, notice: str | None) -> None:
        self.writer.finish(notice or "")  # WeCom stops polling either way


def stream_generation(llm: LLMBackend, messages: list[dict], params: GenerationParams,
                      on_text) -> Generation:
    """Run the model through its streaming interface, handing ``on_text`` the answer so far.

    Only the answer is handed on, never the think part; ``on_text`` is still asked while the
    model thinks, so its deadline holds then too. When ``on_text`` says stop, the generation is
    abandoned (closing the stream aborts it in the engine or the HTTP request to the model
    server) and what was written is the answer; its token counts are then estimated from the
    text, thinking included, an upper bound like the budget's.
    """
    parts: list[str] = []
    thoughts: list[str] = []
    deltas = llm.stream(messages, params)
    try:
        for delta in deltas:
            if delta.final is not None:
                return delta.final
            if delta.reasoning:
                thoughts.append(delta.reasoning)
            if delta.text:
                parts.append(delta.text)
            if (delta.text or delta.reasoning) and not on_text("".join(parts)):
                break
    finally:
        deltas.close()
    text, reasoning = "".join(parts), "".join(thoughts)
    return Generation(text=text, model=llm.model_name, prompt_tokens=estimate_prompt_tokens(messages),
                      completion_tokens=estimate_completion_tokens(text, reasoning),
                      finish_reason=DEADLINE,
                      reasoning=reasoning)
