"""Tiny models made on this machine, never downloaded: for the real-vLLM tests and the examples.

Both share a byte-level BPE tokenizer trained here on generated text and a Hermes-style (ChatML)
chat template with ``<think>``, ``<tool_call>`` and ``<tool_response>`` tokens:

- ``random``: a Qwen2 architecture (hidden 128, 2 layers, 4 heads / 2 KV heads of size 32) with
  random weights; it never makes a valid tool call;
- ``scripted``: the same architecture with weights set by hand so that, under the calculator tool,
  it thinks (one of two thoughts, 60/40: real sampling, real logprobs), calls the calculator with
  ``6*7``, after the first tool result calls it again with ``40+2``, and after the second answers
  ``\\boxed{42}``. One attention head notices a ``<tool_response>`` in the context, another the
  second call's expression; the MLP turns (current token, what was noticed) into the next token.

`build(kind, root)` writes a Hugging Face model folder under ``root/<kind>-<recipe digest>``
and reuses it when it exists, so CI caches it by recipe. Needs ``torch``, ``transformers`` and
``tokenizers`` (the ``vllm`` extra has them).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Kind = Literal["random", "scripted"]

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
THOUGHTS = ("I will use the calculator.", "Let me compute it.")
"""The scripted model's two thoughts, sampled 60/40."""
CALL_HEAD = '{"name": "calculator", "arguments": {"expression": "'
EXPR_1, EXPR_2 = "6*7", "40+2"
CALL_TAIL = '"}}'
ANSWER = "The answer is \\boxed{42}."
CHUNKS = [*THOUGHTS, CALL_HEAD, EXPR_1, EXPR_2, CALL_TAIL, ANSWER]
"""Whole strings the scripted model emits as one token each (added tokens of the tokenizer)."""
PROMPT = "What is 6*7? Put the final answer in \\boxed{}."
"""A task the scripted model solves (expected answer 42)."""

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 128, 2, 4, 2, 32, 256
VOCAB = 512
MAX_POSITIONS = 2048
CONST = 20.0
"""Every token's embedding holds this in one dimension, so RMSNorm scales all tokens alike."""
MARGIN = 16.0
"""Logit of the scripted next token over every other token (p of anything else ~ 1e-4)."""
GENERATION = {"top_k": 20, "repetition_penalty": 1.05, "temperature": 0.7}
"""What the models' generation_config.json recommends: a server that applies it overrides
sampling (what gymbus detects and warns about)."""

TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags.<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{{- '<|im_start|>user\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if m.content %}{{- m.content }}{%- endif %}"
    "{%- for tc in m.tool_calls or [] %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' }}"
    "{%- if tc.function.arguments is string %}{{- tc.function.arguments }}"
    "{%- else %}{{- tc.function.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Hermes-style: a tool call is re-rendered with newlines around it (the model writes none), so
per-turn prompts do not concatenate (what token-exact trajectories are for); like many templates it
renders no separate reasoning field, so a thought only reaches the model inside the message text."""


def recipe_digest(kind: Kind) -> str:
    """What names a built model: this module's source and the kind."""
    source = Path(__file__).read_bytes()
    return hashlib.sha256(source + kind.encode()).hexdigest()[:12]


def build(kind: Kind, root: str | Path) -> Path:
    """The model folder of ``kind`` under ``root``, built once per recipe."""
    out = Path(root) / f"{kind}-{recipe_digest(kind)}"
    if (out / "config.json").exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tokenizer = _tokenizer()
    tokenizer.save_pretrained(tmp)
    model = _model(kind, tokenizer)
    model.save_pretrained(tmp, safe_serialization=True)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    gen = {"eos_token_id": eot, "pad_token_id": eot, "do_sample": True, **GENERATION}
    (tmp / "generation_config.json").write_text(json.dumps(gen, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _corpus(n: int = 3000) -> list[str]:
    rng = random.Random(0)
    words = "the a baker makes trays of cookies sells how many are left train travels hours speed".split()
    words += "what is put final answer in boxed compute number sum product total each day pages".split()
    lines = []
    for _ in range(n):
        a, b = rng.randint(1, 999), rng.randint(1, 99)
        op = rng.choice("+-*/")
        lines.append(f"What is {a}{op}{b}? " + " ".join(rng.choices(words, k=8)) + " \\boxed{" + str(a) + "}.")
        lines.append(json.dumps({"type": "function", "name": "calculator", "expression": f"{a}{op}{b}"}))
    return lines


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(SPECIAL) - len(TAGS) - len(CHUNKS),
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=MAX_POSITIONS,
    )
    fast.add_tokens(TAGS + CHUNKS)
    fast.chat_template = TEMPLATE
    return fast


def _config(vocab: int, eot: int) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        rope_theta=1e6,
        tie_word_embeddings=False,
        eos_token_id=eot,
        bos_token_id=eot,
        torch_dtype="float32",
    )


def _model(kind: Kind, tokenizer: Any) -> Any:
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    ids = tokenizer.get_vocab()
    cfg = _config(len(tokenizer), ids["<|im_end|>"])
    model = Qwen2ForCausalLM(cfg).to(torch.float32)
    if kind == "scripted":
        with torch.no_grad():
            _script(model, tokenizer)
    return model


RULES = {
    "answer": ({"</think>": 1, "B": 1}, 1.5),
    "tool_call": ({"</think>": 1, "B": -1}, 0.5),
    "call_1": ({CALL_HEAD: 1, "A": -1}, 0.5),
    "call_2": ({CALL_HEAD: 1, "A": 1}, 1.5),
}
"""MLP branch units: on when the weighted features (the current token, A, B) exceed the threshold."""
CHAIN = {
    "\n*": "<think>",
    THOUGHTS[0]: "</think>",
    THOUGHTS[1]: "</think>",
    "<tool_call>": CALL_HEAD,
    EXPR_1: CALL_TAIL,
    EXPR_2: CALL_TAIL,
    CALL_TAIL: "</tool_call>",
    "</tool_call>": "<|im_end|>",
    ANSWER: "<|im_end|>",
}
"""The next token after each scripted token that has one successor whatever the context."""
BRANCH = {"answer": ANSWER, "tool_call": "<tool_call>", "call_1": EXPR_1, "call_2": EXPR_2}
"""The token each branch unit writes."""


@dataclass
class _Dims:
    """Residual dimensions: 0 a constant, one per scripted token class ("<other>" for every other
    token; "\\n*" the generation prompt's last token), A (a tool response was seen), B (the second
    expression was seen), then one per branch unit of the MLP."""

    vocab: dict[str, int]
    token: dict[str, int]
    dim: dict[str, int]
    unit: dict[str, int]

    @property
    def a(self) -> int:
        return len(self.dim) + 1

    @property
    def b(self) -> int:
        return len(self.dim) + 2

    def feature(self, name: str) -> int:
        return self.a if name == "A" else self.b if name == "B" else self.dim[name]


def _dims(tokenizer: Any) -> _Dims:
    v = tokenizer.get_vocab()
    names = ["<other>", "\n*", "<think>", *THOUGHTS, "</think>", "<tool_call>", CALL_HEAD, EXPR_1, EXPR_2, CALL_TAIL]
    names += ["</tool_call>", ANSWER, "<tool_response>"]
    dim = {n: 1 + i for i, n in enumerate(names)}
    token = {n: v[n] for n in names if n in v}
    token["\n*"] = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)[-1]
    unit = {u: len(names) + 3 + i for i, u in enumerate(RULES)}
    return _Dims(v, token, dim, unit)


def _script(model: Any, tokenizer: Any) -> None:
    """Set every weight so the model follows the script (see the module docstring); layer 1 stays zero."""
    for p in model.parameters():
        p.zero_()
    d = _dims(tokenizer)
    m, layer = model.model, model.model.layers[0]
    emb = m.embed_tokens.weight
    emb[:, 0] = CONST
    emb[:, d.dim["<other>"]] = 1.0
    for name, tid in d.token.items():
        emb[tid, d.dim["<other>"]] = 0.0
        emb[tid, d.dim[name]] = 1.0
    scale = CONST / HIDDEN**0.5  # RMSNorm of a token ~ CONST/sqrt(H): undo it, so normalized = residual
    for norm in (layer.input_layernorm, layer.post_attention_layernorm, m.norm, *_other_norms(m)):
        norm.weight.fill_(scale)
    _attention(layer.self_attn, d)
    _branch_units(layer.mlp, d)
    _output(model.lm_head.weight, d)


def _attention(attn: Any, d: _Dims, score: float = 40.0) -> None:
    """q head 0 (kv head 0) finds <tool_response> -> A; q head 2 (kv head 1) finds 40+2 -> B. The
    lowest-frequency rotary pair (dims 15/31 of a head) barely turns over 2048 positions."""
    slot = HEAD_DIM // 2 - 1
    for q_head, kv_head, source, target in ((0, 0, "<tool_response>", d.a), (2, 1, EXPR_2, d.b)):
        attn.q_proj.bias[q_head * HEAD_DIM + slot] = score
        attn.k_proj.weight[kv_head * HEAD_DIM + slot, d.dim[source]] = score
        attn.v_proj.weight[kv_head * HEAD_DIM + slot, d.dim[source]] = 1.0
        attn.o_proj.weight[target, q_head * HEAD_DIM + slot] = 1.0


def _branch_units(mlp: Any, d: _Dims, k: float = 40.0) -> None:
    """Each unit is silu(k * (features - threshold)) * 1: ~1 when on, ~0 when off."""
    for i, (unit, (weights, threshold)) in enumerate(RULES.items()):
        for feature, w in weights.items():
            mlp.gate_proj.weight[i, d.feature(feature)] = k * w
        mlp.gate_proj.weight[i, 0] = -k * threshold / CONST
        mlp.up_proj.weight[i, 0] = 1.0 / CONST
        mlp.down_proj.weight[d.unit[unit], i] = 1.0 / (k * 0.5)


def _output(head: Any, d: _Dims) -> None:
    """The next token from the current one, or from a branch unit; anything else gets a broad, uneven
    distribution, so a probe of the sampling parameters sees each one."""
    import torch

    for cur, nxt in CHAIN.items():
        head[d.vocab[nxt], d.dim[cur]] = MARGIN
    head[d.vocab[THOUGHTS[0]], d.dim["<think>"]] = MARGIN
    head[d.vocab[THOUGHTS[1]], d.dim["<think>"]] = MARGIN - 0.405  # 60/40
    head[:, d.dim["<other>"]] = 2.0 * torch.randn(head.shape[0], generator=torch.Generator().manual_seed(1))
    for unit, token in BRANCH.items():
        head[d.vocab[token], d.unit[unit]] = MARGIN


def _other_norms(m: Any) -> list[Any]:
    rest = m.layers[1:]
    return [n for layer in rest for n in (layer.input_layernorm, layer.post_attention_layernorm)]
