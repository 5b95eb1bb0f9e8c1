"""The tool parts of a GLM-4.5+ prompt, as the published chat templates write them.

``inference.tokenizer`` lays out the conversation and asks here for the three tool parts:

- the tools, in a ``<|system|>`` turn of their own before every other message: a fixed preamble,
  each tool as JSON (as the client sent it, ``json.dumps`` with ``ensure_ascii=False`` as
  transformers' ``tojson``), and the call format;
- an assistant turn's calls after its text: ``<tool_call>name`` then ``<arg_key>k</arg_key>``
  ``<arg_value>v</arg_value>`` per argument, a string value as it is and any other as JSON;
- tool results: ``<|observation|>`` once for results in a row, each in ``<tool_response>``.

GLM-4.5/4.6 (``glm45``) put a newline after the name and after each tag pair and around a
response; GLM-4.7/GLM-5 (``glm47``) write none.

Pieces are ``Markup`` (the template's own text: a tokenizer splits it at its added tokens, so
``<tool_call>`` becomes its token where the vocabulary has one) or plain ``str`` (what a client,
a tool or a model wrote: always text, so a tool result cannot smuggle in a control token).
"""

from __future__ import annotations

import json


class Markup(str):
    """Text the template itself writes: its tags are the tokenizer's added tokens, if it has them."""


PREAMBLE = ("\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n")
FORMAT = {
    "glm45": ("</tools>\n\nFor each function call, output the function name and arguments within the "
              "following XML format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n"
              "<arg_value>{arg-value-1}</arg_value>\n<arg_key>{arg-key-2}</arg_key>\n"
              "<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>"),
    "glm47": ("</tools>\n\nFor each function call, output the function name and arguments within the "
              "following XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key>"
              "<arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key>"
              "<arg_value>{arg-value-2}</arg_value>...</tool_call>"),
}
LAYOUTS = tuple(FORMAT)


def tools_turn(layout: str, tools: list[dict]) -> list[str]:
    """The tools' system turn, without its ``<|system|>`` token."""
    pieces: list[str] = [Markup(PREAMBLE)]
    for tool in tools:
        pieces += [json.dumps(tool, ensure_ascii=False), Markup("\n")]
    return [*pieces, Markup(FORMAT[layout])]


def call_pieces(layout: str, calls: list[dict] | None) -> list[str]:
    """An assistant turn's calls (OpenAI's ``tool_calls``, or ``{"name", "arguments"}``);
    ``arguments`` a dict, or a JSON object as text (OpenAI's)."""
    sep = Markup("\n" if layout == "glm45" else "")
    pieces: list[str] = []
    for call in calls or ():
        function = call.get("function") or call
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        pieces += [sep, Markup("<tool_call>"), function["name"], sep]
        for key, value in arguments.items():
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            pieces += [Markup("<arg_key>"), key, Markup("</arg_key>"), sep,
                       Markup("<arg_value>"), text, Markup("</arg_value>"), sep]
        pieces.append(Markup("</tool_call>"))
    return pieces


def response_pieces(layout: str, content: str, first_in_row: bool) -> list[str]:
    """One tool result; the first of results in a row opens the observation turn."""
    sep = Markup("\n" if layout == "glm45" else "")
    opening = [Markup("<|observation|>")] if first_in_row else []
    return [*opening, sep, Markup("<tool_response>"), sep, content, sep, Markup("</tool_response>")]
