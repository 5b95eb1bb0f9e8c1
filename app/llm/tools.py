"""Tool calls as the model interface carries them (``app.llm``): one representation for both
backends, so the worker's tool loop and the web tier's ``/v1`` never ask which one answered.

The names are the engine's own (``inference.tool_calls``), re-exported here because the rest
of ``app`` reaches the model only through ``app.llm``:

- ``GenerationParams.tools``: ``ToolSpec``s (``check_tools`` makes them from OpenAI's ``tools``;
  ``ToolSpec.openai`` is the dict as given), ``GenerationParams.tool_choice``: a ``ToolChoice``;
- ``Generation.tool_calls``: the calls the reply made, ``ToolCall(id, name, arguments)`` with
  ``arguments`` a JSON object as text (``parsed_arguments()`` reads it); ``finish_reason`` is
  then "tool_calls";
- ``StreamDelta.tool_calls``: the calls as they stream, ``ToolCallDelta``s (OpenAI's
  ``delta.tool_calls`` items: id and name first, then argument pieces, by ``index``);
- the conversation goes on in OpenAI's messages: the assistant turn with ``tool_calls``
  (``ToolCall.as_openai()`` each), then one ``{"role": "tool", "tool_call_id", "content"}`` per
  call; ``check_tool_turns`` refuses a conversation OpenAI would refuse.

With the bundled engine the calls are parsed from the model's GLM-4.5+ call format and a forced
``tool_choice`` constrains its decoding (``inference.reply``); with an OpenAI-compatible server
they are taken as that server sends them.
"""

from inference.tool_calls import (
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolRequestError,
    ToolSpec,
    check_tool_choice,
    check_tool_turns,
    check_tools,
)

__all__ = ["ToolCall", "ToolCallDelta", "ToolChoice", "ToolRequestError", "ToolSpec", "check_tool_choice",
           "check_tool_turns", "check_tools"]
