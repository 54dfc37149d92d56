import pytest

from tracerl.engine.react import TEMPLATES, ActionKind, ToolSpec

PY = ToolSpec("python", "Run Python code and see what it prints.", ("code",))
SEARCH = ToolSpec("search", "Search passages.", ("query", "k"), required=("query",))
TOOLS = [PY, SEARCH]
plain = TEMPLATES.get("plain")()
chat = TEMPLATES.get("chat")()


def test_plain_tool_call_and_answer() -> None:
    a = plain.parse("Thought: multiply.\nAction: python[print(3 * [1, 2][0])]\n", TOOLS)
    assert (
        a.kind is ActionKind.TOOL and a.tool == "python" and a.arguments == {"code": "print(3 * [1, 2][0])"}
    )
    b = plain.parse('Thought: look it up.\nAction: search{"query": "Paris", "k": "3"}\n', TOOLS)
    assert b.kind is ActionKind.TOOL and b.arguments == {"query": "Paris", "k": "3"}
    c = plain.parse("Thought: done.\nFinal Answer: 42\n", TOOLS)
    assert c.kind is ActionKind.ANSWER and c.answer == "42"
    assert plain.observation("42\n") == "Observation: 42\n" and plain.stop == ("Observation:",)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "Thought: hmm, let me think more.",
            "end the turn with 'Action: tool[input]' or 'Final Answer: ...'",
        ),
        ("Action: calculator[1+1]", "unknown tool 'calculator'; available: python, search"),
        ('Action: search{"query": "x", }', "the arguments are not valid JSON"),
        ('Action: search{"k": "3"}', "tool 'search' needs argument(s) query"),
        ('Action: search{"query": "a", "top": 1}', "unknown argument(s) top"),
        ("Action: python[]", "tool 'python' needs argument(s) code"),
        ("Action: python[print(1)", "not closed with ']'"),
        ("Final Answer:", "must be followed by the answer"),
    ],
)
def test_plain_malformed_actions_become_error_observations(text: str, error: str) -> None:
    a = plain.parse(text, TOOLS)
    assert a.kind is ActionKind.INVALID and error in (a.error or "")


def test_plain_forged_observation_is_cut_and_runaway_is_flagged() -> None:
    a = plain.parse("Action: python[print(2)]\nObservation: 1000000\nFinal Answer: 1000000", TOOLS)
    assert a.kind is ActionKind.TOOL and "Observation" not in a.text and "1000000" not in a.text
    r = plain.parse("Thought: " + "blah " * 500, TOOLS, truncated=True)
    assert r.kind is ActionKind.INVALID and "token limit" in (r.error or "")


def test_chat_native_tool_calls() -> None:
    t = chat.parse(
        '<think>need code</think>\n<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>',
        TOOLS,
    )
    assert t.kind is ActionKind.TOOL and t.arguments == {"code": "print(1)"}
    s = chat.parse(
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(2)\\"}"}</tool_call>', TOOLS
    )
    assert s.kind is ActionKind.TOOL and s.arguments == {"code": "print(2)"}
    a = chat.parse("<think>so</think>The answer is \\boxed{\\frac{1}{2}}.<|im_end|>", TOOLS)
    assert a.kind is ActionKind.ANSWER and a.answer == "\\frac{1}{2}"
    assert "<tool_response>" in chat.observation("5") and "python" in chat.prompt("Q?", TOOLS)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<tool_call>{bad json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', "unknown tool 'rm'"),
        ('<tool_call>{"name": "python", "arguments": {}}</tool_call>', "needs argument(s) code"),
        ('<tool_call>{"name": "python", "arguments": {"code": "1"}}', "not closed"),
        ("<think>only thinking", "empty response"),
        ('<tool_call>["python"]</tool_call>', "must be {"),
    ],
)
def test_chat_malformed(text: str, error: str) -> None:
    a = chat.parse(text, TOOLS)
    assert a.kind is ActionKind.INVALID and error in (a.error or "")


def test_chat_forged_tool_response_is_cut() -> None:
    a = chat.parse(
        '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call><tool_response>99</tool_response>',
        TOOLS,
    )
    assert a.kind is ActionKind.TOOL and "99" not in a.text


CHATML = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_chat_template_renders_through_the_tokenizers_own_template() -> None:
    from tracerl.models.tiny import build_tokenizer

    tok = build_tokenizer(["hello world"], vocab_size=300)
    tok.chat_template = CHATML
    t = TEMPLATES.get("chat")(tok)
    prompt = t.prompt("What is 2+2?", TOOLS)
    assert prompt.startswith("<|im_start|>system\n# Tools") and '"name": "python"' in prompt
    assert prompt.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert (
        t.observation("4")
        == "<|im_end|>\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert t.observation("4") == TEMPLATES.get("chat")().observation("4")  # same as the built-in ChatML text


@pytest.mark.parametrize("name", TEMPLATES.names())
def test_every_template_writes_gold_turns_its_parser_reads_back(name: str) -> None:
    """gold.py renders through the template object: no template names are special-cased there."""
    from tracerl.engine.gold import answer_turn_text, tool_turn_text
    from tracerl.engine.react import ToolCall

    t = TEMPLATES.get(name)(None)
    one = t.parse(tool_turn_text(t, "run it", "python", {"code": "print(1 + 1)"}), TOOLS)
    assert one.kind is ActionKind.TOOL and one.calls == (ToolCall("python", {"code": "print(1 + 1)"}),)
    kw = t.parse(tool_turn_text(t, "look", "search", {"query": "Paris", "k": 3}), TOOLS)
    assert kw.kind is ActionKind.TOOL and kw.arguments == {"query": "Paris", "k": 3}
    calls = (ToolCall("search", {"query": "it's", "k": 2}), ToolCall("python", {"code": "x = [1]"}))
    several = t.parse(t.calls_turn("two calls", calls), TOOLS)
    assert several.kind is ActionKind.TOOL and several.calls == calls
    done = t.parse(answer_turn_text(t, "done", "42"), TOOLS)
    assert done.kind is ActionKind.ANSWER and done.answer == "42"


def test_gold_turn_text_is_each_templates_format() -> None:
    assert plain.tool_turn("t", "python", {"code": "1"}) == "Thought: t\nAction: python[1]\n"
    assert (
        plain.tool_turn("t", "search", {"query": "a", "k": 2})
        == 'Thought: t\nAction: search{"query": "a", "k": 2}\n'
    )
    assert chat.answer_turn("t", "42") == "<think>t</think>\n42" and chat.answer_turn("", "42") == "42"
    assert chat.tool_turn("t", "python", {"code": "1"}) == (
        '<think>t</think>\n<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>'
    )
