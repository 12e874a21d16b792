"""lm-eval's ``HFLM`` with each shared context scored once (its KV cache reused).

A multiple-choice item asks for the log-likelihood of every choice after the same
context. lm-eval runs ``context + choice`` through the model once per choice, so a
4-choice item costs four passes over the context, which is most of the tokens
(contexts of a few hundred tokens, choices of a line). For a 135M-parameter teacher
on 2 CPU cores that was most of the suite's time.

Here the requests are grouped by their context tokens. A group with several
continuations runs ``context[:-1]`` once into a ``DynamicCache``, repeats the cache
once per continuation, and runs ``[context[-1]] + continuation[:-1]`` for all of
them as one right-padded batch: position by position the same inputs and the same
causal attention as lm-eval's single pass, so the same log-probabilities (up to
float rounding of the differently shaped matmuls; the test compares both paths).
Everything else (one request per context, as rolling log-likelihood windows are;
a context of one token; a pair lm-eval would truncate) goes to lm-eval's own code.

Imports lm-eval at module level: import this module lazily (``harness.make_lm``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.models.huggingface import HFLM
from transformers import DynamicCache

from autocompress.costmodel.measure import _cache_kwarg  # `cache=` or `past_key_values=`

Request = tuple[Any, list[int], list[int]]  # ((context, continuation) strings, tokens, tokens)


class ContextCachedLM(HFLM):
    """``HFLM`` whose log-likelihood requests share the forward pass of a common context."""

    def _loglikelihood_tokens(self, requests: list[Request], disable_tqdm: bool = False,
                              override_bs: int | None = None) -> list[tuple[float, bool]]:
        groups: dict[tuple[int, ...], list[int]] = {}
        for index, (_, context, _) in enumerate(requests):
            groups.setdefault(tuple(context), []).append(index)
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        rest: list[int] = []
        for context, members in groups.items():
            continuations = [requests[i][2] for i in members]
            if not self._shares_context(context, continuations):
                rest += members
                continue
            for i, answer in zip(members, self._score_group(list(context), continuations),
                                 strict=True):
                results[i] = answer
                if requests[i][0] is not None:  # what lm-eval's loop does for each answer
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], answer)
        if rest:
            answers = super()._loglikelihood_tokens([requests[i] for i in rest],
                                                    disable_tqdm=disable_tqdm,
                                                    override_bs=override_bs)
            for i, answer in zip(rest, answers, strict=True):
                results[i] = answer
        return results  # type: ignore[return-value]

    def _shares_context(self, context: tuple[int, ...], continuations: list[list[int]]) -> bool:
        """Worth caching and scored exactly as lm-eval would (no left truncation)."""
        longest = max(len(c) for c in continuations)
        return (self.backend == "causal" and len(continuations) > 1 and len(context) > 1
                and min(len(c) for c in continuations) > 0
                and len(context) + longest <= self.max_length + 1)

    def _score_group(self, context: list[int],
                     continuations: list[list[int]]) -> list[tuple[float, bool]]:
        model = self.model
        cache_arg = _cache_kwarg(model)
        cache = DynamicCache(config=model.config)
        prefix = torch.tensor([context[:-1]], dtype=torch.long, device=self.device)
        model(input_ids=prefix, use_cache=True, logits_to_keep=1, **{cache_arg: cache})
        cache.batch_repeat_interleave(len(continuations))
        width = max(len(c) for c in continuations)
        # Right padding is never attended to by the real positions before it (causal).
        rows = [[context[-1], *c[:-1]] + [0] * (width - len(c)) for c in continuations]
        logits = model(input_ids=torch.tensor(rows, dtype=torch.long, device=self.device),
                       use_cache=True, **{cache_arg: cache}).logits
        logprobs = F.log_softmax(logits, dim=-1, dtype=self.softmax_dtype)
        answers = []
        for row, continuation in zip(logprobs, continuations, strict=True):
            scores = row[:len(continuation)]
            target = torch.tensor(continuation, dtype=torch.long, device=scores.device)
            greedy = bool((scores.argmax(dim=-1) == target).all())
            answers.append((float(scores.gather(1, target[:, None]).sum()), greedy))
        return answers

