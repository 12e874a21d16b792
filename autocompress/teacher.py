"""The default teacher: a small Llama-architecture code model trained here.

It is the stand-in for a real teacher on machines without a network: a stock
``LlamaForCausalLM`` (RoPE, RMSNorm, SwiGLU, GQA, tied embeddings) trained on the
standard-library corpus, large enough that compression choices matter (8 layers,
2 KV groups of 4 query heads), small enough to train on 2 CPU cores in about an
hour.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import BaseModel
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from autocompress.atomic import publishing_dir, write_json_atomic
from autocompress.data.corpus import ensure_corpus, load_documents, load_manifest
from autocompress.data.tokenizer import train_tokenizer
from autocompress.data.tokens import PackedTokens
from autocompress.errors import AutoCompressError
from autocompress.training import TrainConfig, checkpoint_step, train


class TeacherConfig(BaseModel):
    """Shape and training budget of the default teacher."""

    hidden_size: int = 256
    num_layers: int = 8
    num_heads: int = 8
    num_kv_heads: int = 2
    intermediate_size: int = 768
    vocab_size: int = 4096
    seq_len: int = 256
    batch_size: int = 16
    tokens: int = 5_000_000
    lr: float = 2e-3
    warmup_steps: int = 60
    seed: int = 0
    threads: int = 2
    bf16: bool = False  # CPUs without native bf16 (AVX2-only) run autocast slower than fp32
    eval_batches: int = 24

    @property
    def steps(self) -> int:
        return max(1, self.tokens // (self.seq_len * self.batch_size))


def llama_config(cfg: TeacherConfig, tokenizer) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.hidden_size // cfg.num_heads,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def causal_lm_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over a packed batch."""
    logits = model(input_ids=batch).logits[:, :-1]
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def heldout_eval_fn(heldout: PackedTokens, n_batches: int, batch_size: int = 8):
    """Mean held-out loss on a fixed set of windows (same every call)."""
    batches = [heldout.windows[i * batch_size:(i + 1) * batch_size] for i in range(n_batches)]
    batches = [b for b in batches if len(b)]

    def evaluate(model) -> dict[str, float]:
        losses = [float(causal_lm_loss(model, b)) for b in batches]
        loss = sum(losses) / len(losses)
        return {"heldout_loss": loss, "heldout_ppl": float(torch.exp(torch.tensor(loss)))}

    return evaluate


def train_teacher(out_dir: Path, cfg: TeacherConfig, work_dir: Path,
                  corpus_dir: Path | None = None, overwrite: bool = True) -> dict:
    """Train (or resume) the teacher; write a complete model dir to ``out_dir``.

    ``work_dir`` keeps the tokenizer and checkpoints, so an interrupted run
    resumes from its last checkpoint. ``out_dir`` is replaced only at the end
    (refused if it is not empty and ``overwrite`` is False).
    """
    torch.set_num_threads(cfg.threads)
    corpus_dir = ensure_corpus(corpus_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(work_dir / "tokenizer", corpus_dir, cfg.vocab_size)
    train_data = PackedTokens(tokenizer, corpus_dir, "train", cfg.seq_len)
    heldout = PackedTokens(tokenizer, corpus_dir, "heldout", cfg.seq_len)
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(llama_config(cfg, tokenizer))
    train_cfg = TrainConfig(max_steps=cfg.steps, lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                            seed=cfg.seed, ckpt_every=50, eval_every=200, bf16=cfg.bf16)
    started = time.time()
    resumed_from = checkpoint_step(work_dir / "checkpoints")
    state = train(
        model, causal_lm_loss, lambda step: train_data.batch_at(step, cfg.batch_size, cfg.seed),
        train_cfg, ckpt_dir=work_dir / "checkpoints",
        eval_fn=heldout_eval_fn(heldout, cfg.eval_batches),
        tokens_per_step=cfg.batch_size * cfg.seq_len, description="teacher",
    )
    card = {
        "config": cfg.model_dump(),
        "params": sum(p.numel() for p in model.parameters()),
        "corpus_fingerprint": load_manifest(corpus_dir).fingerprint,
        "train_tokens_available": train_data.num_tokens,
        "tokens_seen": state.step * cfg.batch_size * cfg.seq_len,
        "train_seconds": round(state.seconds, 1),
        "wall_seconds_this_invocation": round(time.time() - started, 1),
        "resumed_from_step": resumed_from,
        "final_eval": state.evals[-1] if state.evals else {},
        "evals": state.evals,
        "loss_curve": [h["loss"] for h in state.history[:: max(1, len(state.history) // 200)]],
        "torch_threads": cfg.threads,
    }
    _publish(out_dir, model, tokenizer, card, overwrite)
    return card


def _tokenizer(path: Path, corpus_dir: Path, vocab_size: int):
    if (path / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(path)
    docs = load_documents(corpus_dir, "train")
    tok = train_tokenizer((d.text for d in docs), vocab_size)
    with publishing_dir(path, overwrite=True) as tmp:
        tok.save_pretrained(tmp)
    return tok


def _publish(out_dir: Path, model, tokenizer, card: dict, overwrite: bool) -> None:
    """Write weights, tokenizer and training record, then swap the dir in."""
    with publishing_dir(out_dir, overwrite=overwrite) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        write_json_atomic(tmp / "training.json", card, indent=1)


def write_model_card(model_dir: Path, eval_json: Path | None = None) -> Path:
    """README.md for the teacher: shape, data, budget, held-out and benchmark scores."""
    if not (model_dir / "training.json").is_file():  # a card describes a training run
        raise AutoCompressError(f"{model_dir} has no training.json, so it was not trained by "
                                "`autocompress teacher train`",
                                "pass the directory that `autocompress teacher train` wrote")
    record = json.loads((model_dir / "training.json").read_text())
    cfg = record["config"]
    lines = [
        "# AutoCompress default teacher",
        "",
        "A small Llama-architecture (`LlamaForCausalLM`) code model trained by AutoCompress on",
        "the Python standard library, so that the whole pipeline runs with no network.",
        "",
        "| | |", "|---|---|",
        f"| parameters | {record['params']:,} |",
        f"| layers / hidden / FFN | {cfg['num_layers']} / {cfg['hidden_size']} / "
        f"{cfg['intermediate_size']} |",
        f"| heads / KV heads / head dim | {cfg['num_heads']} / {cfg['num_kv_heads']} / "
        f"{cfg['hidden_size'] // cfg['num_heads']} |",
        f"| vocabulary | {cfg['vocab_size']} (byte-level BPE, trained on the train split) |",
        f"| corpus fingerprint | `{record['corpus_fingerprint'][:16]}` |",
        f"| tokens seen | {record['tokens_seen']:,} (train split: "
        f"{record['train_tokens_available']:,} tokens) |",
        f"| training time | {record['train_seconds'] / 60:.1f} min on {record['torch_threads']} "
        "CPU threads |",
    ]
    final = record.get("final_eval", {})
    if final:
        lines.append(f"| held-out loss / perplexity | {final['heldout_loss']:.3f} / "
                     f"{final['heldout_ppl']:.2f} |")
    if eval_json and Path(eval_json).exists():
        scores = json.loads(Path(eval_json).read_text())
        lines += ["", "## Benchmarks (`autocompress eval`)", "", "| task | score | ± | chance |",
                  "|---|---|---|---|"]
        for name, t in scores["tasks"].items():
            stderr = t.get("stderr")
            stderr = f"{stderr:.3f}" if isinstance(stderr, float) else "n/a"
            chance = t.get("chance")
            chance = f"{chance:.3f}" if isinstance(chance, float) else "-"
            lines.append(f"| {name} | {t['score']:.3f} | {stderr} | {chance} |")
        mean, chance_mean = scores["mc_mean"], scores["mc_chance_mean"]
        lines.append(f"| **MC mean** | {mean:.3f} | | {chance_mean:.3f} |")
    lines += ["", "## Reproduce", "", "```", "autocompress data prepare",
              f"autocompress teacher train --tokens {cfg['tokens']} --threads {cfg['threads']}",
              "```", ""]
    path = model_dir / "README.md"
    path.write_text("\n".join(lines))
    return path
