"""Inputs of the translator's golden files (tests/golden/translate/*.json); the expected outputs live
in the files. Regenerate with GYMBUS_UPDATE_GOLDEN=1 pytest tests/test_translate.py, then read the diff."""

from __future__ import annotations

CALC = {
    "type": "function",
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    "strict": True,
}
TRAINING = {"prompt_token_ids": [1, 2], "generation_token_ids": [3], "generation_log_probs": [-0.5]}

MULTI_TURN = [
    {"type": "message", "role": "developer", "content": "Use the calculator for arithmetic."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is 6*7 and 2+2?"}]},
    {"type": "function_call", "call_id": "call_1", "name": "calculator", "arguments": '{"expression": "6*7"}'},
    {
        "type": "function_call",
        "call_id": "call_2",
        "name": "calculator",
        "arguments": '{"expression": "2+2"}',
        **TRAINING,
    },
    {"type": "function_call_output", "call_id": "call_1", "output": "42"},
    {"type": "function_call_output", "call_id": "call_2", "output": {"value": 4}},
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "6*7 = 42 and 2+2 = 4.", "annotations": []}],
        **TRAINING,
    },
    {"type": "message", "role": "user", "content": "Now add them."},
]

WITH_REASONING = [
    {"type": "message", "role": "user", "content": "What is 6*7?"},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "I should use the tool."}]},
    {"type": "function_call", "call_id": "call_1", "name": "calculator", "arguments": '{"expression": "6*7"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "42"},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "The tool said 42."}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "\\boxed{42}"}]},
]

REQUESTS = {
    "request_multi_turn_tools": (
        "server",
        {
            "model": "policy",
            "instructions": "You are a careful assistant.",
            "input": MULTI_TURN,
            "tools": [CALC],
            "tool_choice": {"type": "function", "name": "calculator"},
            "parallel_tool_calls": True,
            "max_output_tokens": 512,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 20,
            "seed": 3,
            "text": {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": True}},
            "reasoning": {"effort": "low"},
            "store": False,
            "chat_template_kwargs": {"enable_thinking": False},
        },
    ),
    "request_string_input": ("server", {"model": "policy", "input": "What is 6*7?", "tool_choice": "auto"}),
    "request_reasoning_server": ("server", {"model": "policy", "input": WITH_REASONING, "tools": [CALC]}),
    "request_reasoning_think_tags": ("think_tags", {"model": "policy", "input": WITH_REASONING, "tools": [CALC]}),
}

ANSWERS = {
    "answer_tool_calls": (
        "server",
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": "Let me compute both.",
                        "tool_calls": [
                            {
                                "id": "call_a",
                                "type": "function",
                                "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
                            },
                            {
                                "id": "call_b",
                                "type": "function",
                                "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'},
                            },
                        ],
                    },
                }
            ],
            "usage": {
                "prompt_tokens": 120,
                "completion_tokens": 40,
                "total_tokens": 160,
                "prompt_tokens_details": {"cached_tokens": 64},
                "completion_tokens_details": {"reasoning_tokens": 0},
            },
        },
    ),
    "answer_reasoning_field": (
        "server",
        {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "\\boxed{42}", "reasoning": "6 times 7 is 42."},
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 9, "total_tokens": 19},
        },
    ),
    "answer_reasoning_content_legacy": (
        "server",
        {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "42", "reasoning_content": "Old vLLM field name."},
                }
            ],
        },
    ),
    "answer_think_tags": (
        "think_tags",
        {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "<think>\n6 times 7 is 42.\n</think>\n\n\\boxed{42}"},
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30},
        },
    ),
    "answer_think_tags_opened_by_template": (
        "think_tags",
        {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": "I need the tool.</think>",
                        "tool_calls": [
                            {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}
                        ],
                    },
                }
            ],
        },
    ),
    "answer_think_tags_cut_by_length": (
        "think_tags",
        {
            "choices": [
                {"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "<think>Hmm, 6"}}
            ],
        },
    ),
    "answer_think_tags_server_mode_untouched": (
        "server",
        {"choices": [{"index": 0, "message": {"role": "assistant", "content": "<think>x</think>42"}}]},
    ),
}

RESPONSES_ANSWERS = {
    "responses_think_tags": (
        "think_tags",
        {
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "<think>Easy.</think>\\boxed{42}", "annotations": []}],
                },
                {"type": "function_call", "call_id": "c1", "name": "calculator", "arguments": "{}"},
            ],
            "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
        },
    ),
    "responses_incomplete": (
        "server",
        {
            "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
            "output": [{"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Long"}]}],
            "usage": {"input_tokens": 10, "output_tokens": 512},
        },
    ),
}
