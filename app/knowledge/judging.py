"""One passage at a time (``KB_JUDGE_EACH_PASSAGE``): the model judges each retrieved passage alone.

A small model shown several passages at once learns which *questions* the handbook answers, not
which passage answers this one (the bundled demo, shown three, answered the IT desk's number
over other topics' passages). Shown one, the only thing to decide is whether *it* answers. So
the model is asked once per passage, best first, each prompt holding that passage alone as
[1]; the first reply that is not its "not found" is the answer, its citation renumbered to the
passage's place among all of them, so that sources are named as usual. When it declines every
passage, the reply is its "not found". Up to ``KB_TOP_K`` calls a question, each a fraction of
the long prompt; every call's tokens are counted in the one generation returned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from app.knowledge import prompt
from app.knowledge.retrieval import Passage
from app.llm import Generation, GenerationParams

Generate = Callable[[list[dict], GenerationParams], Generation]


def judges_each_passage(settings, passages: list[Passage]) -> bool:
    """Whether these settings ask the model about each passage on its own."""
    return bool(settings.kb_judge_each_passage and settings.kb_passages_in_prompt and passages)


def renumbered(reply: str, number: int) -> str:
    """A reply written over one passage ([1]) as written over all of them ([number])."""
    return prompt.CITATION.sub(lambda m: f"[{number}]" if m.group(1) == "1" else m.group(0), reply)


def answer_each(generate: Generate, messages_for: Callable[[list[Passage]], list[dict]],
                passages: list[Passage], params_for: Callable[[list[Passage]], GenerationParams]) -> Generation:
    """The model's answer from the first passage (in the given order) it does not decline.

    ``messages_for([p])`` and ``params_for([p])`` are the prompt and parameters over one passage
    (the worker's grounded messages; the quote choices when it answers by quoting)."""
    prompt_tokens = completion_tokens = cached_tokens = 0
    latency = 0.0
    generation = None
    for number, passage in enumerate(passages, 1):
        generation = generate(messages_for([passage]), params_for([passage]))
        prompt_tokens += generation.prompt_tokens
        completion_tokens += generation.completion_tokens
        cached_tokens += generation.cached_tokens
        latency += generation.latency_s
        if generation.text.strip() and not prompt.is_decline(generation.text):
            generation = replace(generation, text=renumbered(generation.text, number))
            break
    if generation is None:
        raise ValueError("answer_each: no passage to judge")
    return replace(generation, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   cached_tokens=cached_tokens, latency_s=latency)
