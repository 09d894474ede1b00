"""Token-level records of a rollout for on-policy training: per model call (`Turn`) and, with
``Options.token_exact``, the whole rollout as one token sequence (`Trajectory`). Part of the wire:
`broker.schemas.Result` carries them."""

from __future__ import annotations

import msgspec


class Turn(msgspec.Struct, kw_only=True, omit_defaults=False):
    """Token-level record of one model call, for on-policy training (empty unless requested)."""

    prompt_token_ids: list[int] = []
    """Token ids of the prompt as the server tokenized it."""
    generation_token_ids: list[int] = []
    """Token ids the model generated."""
    generation_log_probs: list[float] = []
    """Log-probability of each generated token."""
    logprobs_mode: str = ""
    """What the logprobs are: ``processed_logprobs`` (the distribution sampled from, after temperature,
    top-k/top-p/min-p and penalties), ``raw_logprobs`` (the model's, before any of them), or "" (unknown)."""
    constrained: bool = False
    """The call forced its output (``tool_choice`` required or named, ``text.format``): the server masked
    the distribution with a grammar, and processed logprobs are those of the masked distribution."""


class Trajectory(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A whole rollout as one token sequence (``Options.token_exact``): the first prompt, then each
    turn's generated ids exactly as sampled, with the tokenized non-model content (tool results, the
    template's turn markers) spliced in between."""

    token_ids: list[int] = []
    """Every token of the rollout so far, in order."""
    generated: list[list[int]] = []
    """``[start, end)`` of each turn's generated span in ``token_ids``."""
    log_probs: list[float] = []
    """Log-probability of each generated token, the spans concatenated in order."""
    n_items: int = 0
    """Conversation items covered (input items and every item produced up to the last model turn)."""
    digest: str = ""
    """SHA-256 of those items: a later turn whose history differs cannot be spliced (``history_changed``)."""

    def loss_mask(self) -> list[int]:
        """1 for each generated token, 0 for prompt and non-model tokens (same length as ``token_ids``)."""
        mask = [0] * len(self.token_ids)
        for start, end in self.generated:
            mask[start:end] = [1] * (end - start)
        return mask
