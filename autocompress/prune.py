"""Pruning: teacher + importance + ArchSpec -> a smaller HeteroForCausalLM.

What is kept (all by importance, each kept set in its original order):

- Depth: a spec with fewer layers than the teacher drops the least important
  teacher layers (``Importance.layers_to_drop``; first and last protected), or
  follows an explicit ``layer_map``.
- Hidden channels: the top ``hidden_size`` channels; the same index slices the
  embeddings, every RMSNorm, every projection's input/output side and the LM
  head, so a tied head stays tied.
- Attention: the teacher's KV groups are split into ``num_kv_heads`` contiguous
  clusters; each cluster becomes one student KV head whose K/V projections are
  the *mean* of the cluster's K/V projections (Puzzle's mean-pooling), and which
  serves the ``num_heads / num_kv_heads`` best query heads of the cluster. With
  as many KV heads as the teacher this is plain per-group query-head pruning
  (evenly in every group). ``head_dim`` never changes.
- FFN: the top ``intermediate_size`` neurons (rows of gate/up, columns of down).
- ``None`` blocks are dropped with their RMSNorm.

Keeping everything reproduces the teacher exactly (the correctness test).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from autocompress.arch import ArchSpec, LayerSpec
from autocompress.atomic import check_out_dir, publishing_dir, write_json_atomic
from autocompress.errors import AutoCompressError
from autocompress.importance import Importance

State = dict[str, torch.Tensor]


def prune(
    model: nn.Module,
    importance: Importance,
    spec: ArchSpec,
    *,
    layer_map: list[int] | None = None,
    depth_metric: str = "cosine",
) -> nn.Module:
    """Build the pruned ``HeteroForCausalLM`` (eval mode, teacher's dtype/device).

    ``spec`` may leave optional fields unset (they come from the teacher).
    ``layer_map[i]`` = teacher layer that student layer ``i`` is cut from; by
    default identity, or the most important layers by ``depth_metric`` when the
    spec has fewer layers than the teacher.
    """
    from autocompress.modeling import HeteroForCausalLM, arch_spec_of, hetero_config_from

    teacher_spec = arch_spec_of(model)
    spec = spec.complete_from(teacher_spec)
    _check_inputs(teacher_spec, importance, spec)
    layer_map = _layer_map(teacher_spec, importance, spec, layer_map, depth_metric)

    teacher_state = {k: v.detach() for k, v in model.state_dict().items()}
    keep_hidden = torch.sort(importance.hidden_order()[: spec.hidden_size]).values
    state = _embedding_state(teacher_state, keep_hidden, spec)
    for student_idx, teacher_idx in enumerate(layer_map):
        state.update(
            _layer_state(
                teacher_state,
                importance,
                teacher_spec,
                spec.layers[student_idx],
                teacher_idx,
                student_idx,
                keep_hidden,
            )
        )

    config = hetero_config_from(spec, model.config, source_layers=layer_map)
    config.source_layers = list(layer_map)  # stored in config.json for distillation/reports
    param = next(model.parameters())
    student = HeteroForCausalLM(config).to(dtype=param.dtype, device=param.device)
    student.load_state_dict(state, strict=True)
    if getattr(model, "generation_config", None) is not None:
        student.generation_config = model.generation_config
    return student.eval()


# ------------------------------------------------------------------ checks


def _check_inputs(teacher: ArchSpec, importance: Importance, spec: ArchSpec) -> None:
    if importance.arch.model_dump() != teacher.model_dump():
        raise AutoCompressError(
            "the importance scores were computed on a model of a different shape",
            hint="recompute importance on this teacher (`autocompress importance`)",
        )
    spec.validate_legality(reference=teacher)
    if spec.head_dim != teacher.head_dim or spec.vocab_size != teacher.vocab_size:
        raise AutoCompressError(
            "head_dim and vocab_size cannot change in pruning",
            hint=f"use head_dim {teacher.head_dim} and vocab_size {teacher.vocab_size}",
        )
    for name in ("tie_word_embeddings", "attention_bias", "attention_output_bias", "mlp_bias"):
        if getattr(spec, name) != getattr(teacher, name):
            raise AutoCompressError(
                f"{name} differs from the teacher's ({getattr(teacher, name)})",
                hint="pruning keeps the teacher's biases and embedding tying: drop the field",
            )
    if spec.qk_norm != teacher.qk_norm:
        raise AutoCompressError(
            f"qk_norm differs from the teacher's ({teacher.qk_norm})", hint="drop the field"
        )


def _layer_map(
    teacher: ArchSpec,
    importance: Importance,
    spec: ArchSpec,
    layer_map: list[int] | None,
    metric: str,
) -> list[int]:
    if layer_map is None:
        dropped = set(importance.layers_to_drop(teacher.num_layers - spec.num_layers, metric))
        layer_map = [i for i in range(teacher.num_layers) if i not in dropped]
    if len(layer_map) != spec.num_layers:
        raise AutoCompressError(
            f"layer_map has {len(layer_map)} entries for {spec.num_layers} spec layers",
            hint="give one teacher layer index per student layer",
        )
    if any(not 0 <= t < teacher.num_layers for t in layer_map):
        raise AutoCompressError(f"layer_map {layer_map} points outside the teacher's layers")
    for student_idx, teacher_idx in enumerate(layer_map):
        want, have = spec.layers[student_idx], teacher.layers[teacher_idx]
        if want.attention and not have.attention or want.ffn and not have.ffn:
            raise AutoCompressError(
                f"layer {student_idx}: teacher layer {teacher_idx} has no block to keep there",
                hint="a removed block cannot be brought back: set it to null in the spec",
            )
        if want.attention and have.attention:
            if want.attention.num_heads > have.attention.num_heads:
                raise AutoCompressError(
                    f"layer {student_idx}: {want.attention.num_heads} heads exceed teacher "
                    f"layer {teacher_idx}'s {have.attention.num_heads}"
                )
            if want.attention.num_kv_heads > have.attention.num_kv_heads:
                raise AutoCompressError(
                    f"layer {student_idx}: {want.attention.num_kv_heads} KV heads exceed teacher "
                    f"layer {teacher_idx}'s {have.attention.num_kv_heads}"
                )
        if want.ffn and have.ffn and want.ffn.intermediate_size > have.ffn.intermediate_size:
            raise AutoCompressError(
                f"layer {student_idx}: intermediate_size {want.ffn.intermediate_size} exceeds "
                f"teacher layer {teacher_idx}'s {have.ffn.intermediate_size}"
            )
    return list(layer_map)


# ---------------------------------------------------------------- slicing


def _embedding_state(teacher: State, keep_hidden: torch.Tensor, spec: ArchSpec) -> State:
    state = {
        "model.embed_tokens.weight": teacher["model.embed_tokens.weight"][:, keep_hidden],
        "model.norm.weight": teacher["model.norm.weight"][keep_hidden],
    }
    if spec.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    else:
        state["lm_head.weight"] = teacher["lm_head.weight"][:, keep_hidden]
    return state


def _layer_state(
    teacher: State,
    importance: Importance,
    teacher_spec: ArchSpec,
    want: LayerSpec,
    teacher_idx: int,
    student_idx: int,
    keep_hidden: torch.Tensor,
) -> State:
    src, dst = f"model.layers.{teacher_idx}.", f"model.layers.{student_idx}."
    state: State = {}
    if want.attention is not None:
        state[dst + "input_layernorm.weight"] = teacher[src + "input_layernorm.weight"][keep_hidden]
        attn = _attention_state(
            teacher, src + "self_attn.", importance, teacher_spec, want, teacher_idx, keep_hidden
        )
        state.update({dst + "self_attn." + k: v for k, v in attn.items()})
    if want.ffn is not None:
        state[dst + "post_attention_layernorm.weight"] = teacher[
            src + "post_attention_layernorm.weight"
        ][keep_hidden]
        keep = torch.sort(importance.ffn_order(teacher_idx)[: want.ffn.intermediate_size]).values
        mlp = _ffn_state(teacher, src + "mlp.", keep, keep_hidden)
        state.update({dst + "mlp." + k: v for k, v in mlp.items()})
    return state


def _ffn_state(teacher: State, src: str, keep: torch.Tensor, keep_hidden: torch.Tensor) -> State:
    state = {
        "gate_proj.weight": teacher[src + "gate_proj.weight"][keep][:, keep_hidden],
        "up_proj.weight": teacher[src + "up_proj.weight"][keep][:, keep_hidden],
        "down_proj.weight": teacher[src + "down_proj.weight"][keep_hidden][:, keep],
    }
    if src + "gate_proj.bias" in teacher:
        state["gate_proj.bias"] = teacher[src + "gate_proj.bias"][keep]
        state["up_proj.bias"] = teacher[src + "up_proj.bias"][keep]
        state["down_proj.bias"] = teacher[src + "down_proj.bias"][keep_hidden]
    return state


def kv_clusters(teacher_groups: int, student_groups: int) -> list[list[int]]:
    """Split teacher KV groups 0..G-1 into ``student_groups`` contiguous, balanced clusters."""
    base, extra = divmod(teacher_groups, student_groups)
    clusters, start = [], 0
    for c in range(student_groups):
        size = base + (1 if c < extra else 0)
        clusters.append(list(range(start, start + size)))
        start += size
    return clusters


def select_heads(
    importance: Importance, teacher_idx: int, teacher_groups: int, want_heads: int, want_groups: int
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """KV clusters and, per cluster, the kept query heads (teacher indices, sorted)."""
    scores = importance.heads[teacher_idx]
    per_group = scores.numel() // teacher_groups
    per_student_group = want_heads // want_groups
    clusters = kv_clusters(teacher_groups, want_groups)
    kept = []
    for c, cluster in enumerate(clusters):
        candidates = torch.cat([torch.arange(g * per_group, (g + 1) * per_group) for g in cluster])
        if per_student_group > candidates.numel():
            raise AutoCompressError(
                f"teacher layer {teacher_idx}: KV cluster {c} has {candidates.numel()} query "
                f"heads, {per_student_group} needed",
                hint="use a number of KV heads that divides the teacher's, or fewer query heads",
            )
        order = torch.argsort(scores[candidates], descending=True, stable=True)
        kept.append(torch.sort(candidates[order[:per_student_group]]).values)
    return clusters, kept


def _attention_state(
    teacher: State,
    src: str,
    importance: Importance,
    teacher_spec: ArchSpec,
    want: LayerSpec,
    teacher_idx: int,
    keep_hidden: torch.Tensor,
) -> State:
    d = teacher_spec.head_dim
    groups = teacher_spec.layers[teacher_idx].attention.num_kv_heads
    clusters, kept = select_heads(
        importance, teacher_idx, groups, want.attention.num_heads, want.attention.num_kv_heads
    )
    q_heads = torch.cat(kept)
    q_rows = _head_rows(q_heads, d)
    state = {
        "q_proj.weight": teacher[src + "q_proj.weight"][q_rows][:, keep_hidden],
        "o_proj.weight": teacher[src + "o_proj.weight"][keep_hidden][:, q_rows],
    }
    if src + "q_proj.bias" in teacher:
        state["q_proj.bias"] = teacher[src + "q_proj.bias"][q_rows]
    if src + "o_proj.bias" in teacher:
        state["o_proj.bias"] = teacher[src + "o_proj.bias"][keep_hidden]
    for name in ("k_proj", "v_proj"):
        weight = teacher[src + name + ".weight"][:, keep_hidden]
        state[name + ".weight"] = _pool_heads(weight, clusters, d)
        if src + name + ".bias" in teacher:
            state[name + ".bias"] = _pool_heads(teacher[src + name + ".bias"], clusters, d)
    for name in ("q_norm.weight", "k_norm.weight"):  # Qwen3: per head_dim, shared by heads
        if src + name in teacher:
            state[name] = teacher[src + name]
    return state


def _head_rows(heads: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Row indices of the given heads in a [heads * head_dim, ...] projection."""
    return (heads.unsqueeze(1) * head_dim + torch.arange(head_dim)).reshape(-1)


def _pool_heads(tensor: torch.Tensor, clusters: list[list[int]], head_dim: int) -> torch.Tensor:
    """Mean of each cluster's KV heads (rows of k/v_proj, or their bias), in fp32."""
    pooled = []
    for cluster in clusters:
        rows = tensor[_head_rows(torch.tensor(cluster), head_dim)].float()
        pooled.append(rows.view(len(cluster), head_dim, *tensor.shape[1:]).mean(dim=0))
    return torch.cat(pooled).to(tensor.dtype)


def describe_pruning(
    teacher_spec: ArchSpec, spec: ArchSpec, layer_map: list[int]
) -> dict[str, Any]:
    """JSON-able record of a pruning (kept next to the pruned model)."""
    return {
        "teacher": teacher_spec.to_dict(),
        "student": spec.to_dict(),
        "layer_map": layer_map,
        "teacher_params": teacher_spec.num_params(),
        "student_params": spec.complete_from(teacher_spec).num_params(),
    }


def prune_checkpoint(
    teacher_dir: str | Path,
    spec: ArchSpec,
    out_dir: str | Path,
    *,
    importance: Importance | str | Path | None = None,
    calibration: Any = None,
    random_channels: bool = False,
    seed: int = 0,
    depth_metric: str = "cosine",
    progress: bool = True,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Prune the model in ``teacher_dir`` to ``spec`` and save it (+ tokenizer) to ``out_dir``.

    ``importance``: scores or a saved file; None computes them on calibration data
    (``calibration``: an ``importance.CalibrationConfig``). ``random_channels``
    ignores importance and keeps random channels (the ablation baseline).
    Writes ``surgery.json`` (teacher, shapes, layer map, parameter counts) beside
    the weights; the directory appears only once complete. A non-empty
    ``out_dir`` is refused (before any work) unless ``overwrite``.
    """
    from autocompress.importance import importance_for_checkpoint, random_importance
    from autocompress.modeling import arch_spec_of, load_causal_lm

    check_out_dir(out_dir, overwrite)
    teacher, tokenizer = load_causal_lm(teacher_dir)
    if random_channels:
        scores, source = random_importance(teacher, seed=seed), f"random(seed={seed})"
    elif isinstance(importance, Importance):
        scores, source = importance, "given"
    elif importance is not None:
        scores, source = Importance.load(importance), str(importance)
    else:
        scores = importance_for_checkpoint(teacher_dir, calibration, progress=progress)
        source = "computed"
    student = prune(teacher, scores, spec, depth_metric=depth_metric)
    teacher_spec = arch_spec_of(teacher)
    record = describe_pruning(teacher_spec, arch_spec_of(student), student.config.source_layers)
    record.update({"teacher_dir": str(teacher_dir), "importance": source})
    with publishing_dir(out_dir, overwrite=overwrite) as tmp:
        student.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        write_json_atomic(tmp / "surgery.json", record)
    return record
