"""Importance (Minitron) and pruning on tiny random models of the real classes."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec
from autocompress.errors import AutoCompressError
from autocompress.importance import Importance, compute_importance, random_importance
from autocompress.modeling import HeteroForCausalLM, arch_spec_of
from autocompress.modeling.tiny import FAMILIES, tiny_model
from autocompress.prune import kv_clusters, prune

torch.set_num_threads(1)
VOCAB = 128


def _batches(count=3, batch=2, length=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (batch, length), generator=gen) for _ in range(count)]


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _layer(heads, kv, width):
    attention = AttentionSpec(num_heads=heads, num_kv_heads=kv) if heads else None
    return LayerSpec(attention=attention, ffn=FFNSpec(intermediate_size=width) if width else None)


# ---------------------------------------------------------------- importance


@pytest.mark.parametrize("criterion", ["activation", "taylor"])
def test_importance_is_invariant_to_batch_split(criterion):
    model = tiny_model("llama")
    ids = torch.cat(_batches(count=2))
    split = compute_importance(model, list(ids.split(1)), removal_batches=0, criterion=criterion)
    whole = compute_importance(model, [ids], removal_batches=0, criterion=criterion)
    torch.testing.assert_close(split.hidden, whole.hidden)
    torch.testing.assert_close(split.ffn[1], whole.ffn[1])
    torch.testing.assert_close(split.heads[2], whole.heads[2])


@pytest.mark.parametrize("criterion", ["activation", "taylor"])
def test_dead_units_score_zero_and_rank_last(criterion):
    model = tiny_model("qwen3", gqa_ratio=2)
    layer = model.model.layers[1]
    with torch.no_grad():
        layer.mlp.up_proj.weight[5].zero_()  # neuron 5 of layer 1 never fires
        layer.self_attn.v_proj.weight[16:32].zero_()  # KV head 1 -> query heads 2, 3 output 0
        for norm in [m for n, m in model.named_modules() if n.endswith("norm") and "_" in n]:
            norm.weight[7] = 0.0  # hidden channel 7 is zero after every layer norm
        model.model.norm.weight[7] = 0.0
    imp = compute_importance(model, _batches(), removal_batches=0, criterion=criterion)
    assert imp.meta["criterion"] == criterion
    assert imp.ffn[1][5] == 0 and imp.ffn_order(1)[-1] == 5
    assert torch.all(imp.heads[1][2:] == 0) and torch.all(imp.heads[1][:2] > 0)
    assert imp.kv_group_order(1).tolist() == [0, 1]
    assert imp.hidden_order()[-1] == 7
    # Channel 7 still moves the RMS of the residual stream, so only its activation is 0.
    assert imp.hidden[7] == 0 if criterion == "activation" else imp.hidden[7] > 0
    assert imp.head_order(1).shape == (2, 2) and set(imp.head_order(1)[1].tolist()) == {2, 3}
    assert all(p.grad is None for p in model.parameters())  # no gradients left behind


def test_taylor_ranks_by_the_loss_change_and_leaves_the_model_as_it_was():
    model = tiny_model("llama")
    flags = [p.requires_grad_(i % 2 == 0).requires_grad for i, p in enumerate(model.parameters())]
    batches = _batches()
    imp = compute_importance(model, batches, removal_batches=0, criterion="taylor")
    assert [p.requires_grad for p in model.parameters()] == flags
    assert all(p.grad is None for p in model.parameters())
    # The first-order estimate of removing each FFN neuron of layer 0 vs the real change:
    # the most and least important by Taylor differ in loss change the same way.
    from autocompress.importance import mean_loss

    base = mean_loss(model, batches, "cpu")
    down = model.model.layers[0].mlp.down_proj.weight
    changes = []
    for j in (int(imp.ffn_order(0)[0]), int(imp.ffn_order(0)[-1])):
        saved = down[:, j].clone()
        with torch.no_grad():
            down[:, j] = 0
        changes.append(abs(mean_loss(model, batches, "cpu") - base))
        with torch.no_grad():
            down[:, j] = saved
    assert changes[0] > changes[1]
    with pytest.raises(AutoCompressError, match="unknown importance criterion"):
        compute_importance(model, batches, criterion="magnitude")


def test_identity_layer_has_zero_depth_importance():
    model = tiny_model("llama", num_layers=4)
    with torch.no_grad():
        model.model.layers[2].self_attn.o_proj.weight.zero_()
        model.model.layers[2].mlp.down_proj.weight.zero_()
    imp = compute_importance(model, _batches(), removal_batches=2)
    assert imp.layer_cosine[2] == pytest.approx(0, abs=1e-6)
    assert imp.attention_cosine[2] == pytest.approx(0, abs=1e-6)
    assert imp.layer_loss[2] == pytest.approx(0, abs=1e-5)
    assert imp.ffn_loss[2] == pytest.approx(0, abs=1e-5)
    assert all(imp.layer_cosine[i] > 1e-3 for i in (0, 1, 3))
    assert not torch.isnan(imp.layer_loss).any() and imp.base_loss > 0
    assert imp.layers_to_drop(1) == [2] and imp.layers_to_drop(1, metric="loss") == [2]
    with pytest.raises(AutoCompressError):
        imp.layers_to_drop(3)  # only 2 layers are not protected


def test_importance_save_load_round_trip(tmp_path):
    model = tiny_model("qwen2", tied=True)
    imp = compute_importance(model, _batches(count=1), removal_batches=1)
    path = imp.save(tmp_path / "sub" / "imp.safetensors")
    again = Importance.load(path)
    assert again.arch == imp.arch and again.num_tokens == imp.num_tokens
    assert again.base_loss == pytest.approx(imp.base_loss)
    for a, b in zip(again.ffn + again.heads, imp.ffn + imp.heads, strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(again.layer_loss, imp.layer_loss)
    (tmp_path / "bad.safetensors").write_bytes(b"garbage")
    with pytest.raises(AutoCompressError):
        Importance.load(tmp_path / "bad.safetensors")
    with pytest.raises(AutoCompressError, match="not found"):
        Importance.load(tmp_path / "missing.safetensors")


def test_importance_of_hetero_model_has_none_for_removed_blocks():
    teacher = tiny_model("llama")
    spec = ArchSpec(hidden_size=64, layers=[_layer(4, 2, 0), _layer(0, 0, 32), _layer(2, 1, 96)])
    student = prune(teacher, random_importance(teacher), spec)
    imp = compute_importance(student, _batches(count=1), removal_batches=1)
    assert imp.ffn[0] is None and imp.heads[1] is None
    assert imp.heads[2].shape == (2,) and imp.ffn[1].shape == (32,)
    assert torch.isnan(imp.ffn_loss[0]) and not torch.isnan(imp.ffn_loss[1])


# ------------------------------------------------------------------- pruning


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("gqa_ratio", [1, 2, 4])
def test_keep_everything_reproduces_teacher(family, tied, gqa_ratio):
    extra = {"attention_bias": True, "mlp_bias": True} if family == "llama" and tied else {}
    teacher = tiny_model(family, tied=tied, gqa_ratio=gqa_ratio, **extra)
    imp = random_importance(teacher, seed=1)  # any ranking: kept sets keep their order
    student = prune(teacher, imp, arch_spec_of(teacher))
    assert isinstance(student, HeteroForCausalLM)
    ids = _batches(count=1)[0]
    torch.testing.assert_close(_logits(student, ids), _logits(teacher, ids), rtol=0, atol=1e-5)


def _masked_teacher(teacher, layer, neurons=(), heads=(), head_dim=16):
    """The teacher with some FFN neurons / query heads silenced (exactly what pruning removes)."""
    masked = type(teacher)(teacher.config)
    masked.load_state_dict(teacher.state_dict())
    block = masked.model.layers[layer]
    with torch.no_grad():
        for n in neurons:
            block.mlp.down_proj.weight[:, n] = 0
        for h in heads:
            block.self_attn.o_proj.weight[:, h * head_dim : (h + 1) * head_dim] = 0
    return masked.eval()


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_pruning_neurons_and_heads_equals_masking_them(family):
    teacher = tiny_model(family, gqa_ratio=2, tied=True)  # 4 heads, 2 KV groups, 96 neurons
    imp = compute_importance(teacher, _batches(), removal_batches=0)
    spec = arch_spec_of(teacher)
    layers = list(spec.layers)
    layers[1] = _layer(2, 2, 40)  # one query head per group, 40 neurons
    student = prune(teacher, imp, spec.model_copy(update={"layers": layers}))

    dropped_neurons = imp.ffn_order(1)[40:].tolist()
    dropped_heads = imp.head_order(1)[:, 1].tolist()  # the weaker head of each group
    masked = _masked_teacher(teacher, 1, dropped_neurons, dropped_heads)
    ids = _batches(count=1, seed=5)[0]
    torch.testing.assert_close(_logits(student, ids), _logits(masked, ids), rtol=0, atol=1e-5)
    assert (
        sum(p.numel() for p in student.parameters())
        == spec.model_copy(update={"layers": layers}).num_params()
    )


def test_kv_reduction_mean_pools_groups():
    teacher = tiny_model("llama", gqa_ratio=2)  # 2 KV groups
    # Make both KV heads identical in every layer: pooling them must then be exact.
    with torch.no_grad():
        for layer in teacher.model.layers:
            for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.weight[16:32] = proj.weight[0:16]
    spec = arch_spec_of(teacher)
    merged = spec.model_copy(update={"layers": [_layer(4, 1, 96)] * 3})
    student = prune(teacher, random_importance(teacher), merged)
    assert student.model.layers[0].self_attn.k_proj.weight.shape == (16, 64)
    ids = _batches(count=1)[0]
    torch.testing.assert_close(_logits(student, ids), _logits(teacher, ids), rtol=0, atol=1e-5)


def test_kv_pooling_is_the_mean_of_the_cluster():
    teacher = tiny_model("qwen2", gqa_ratio=1)  # 4 KV heads, with biases
    spec = arch_spec_of(teacher)
    two = spec.model_copy(update={"layers": [_layer(2, 2, 96)] * 3})
    student = prune(teacher, random_importance(teacher), two)
    k_teacher = teacher.model.layers[0].self_attn.k_proj
    k_student = student.model.layers[0].self_attn.k_proj
    expected = (k_teacher.weight[32:48] + k_teacher.weight[48:64]) / 2
    torch.testing.assert_close(k_student.weight[16:32], expected)
    torch.testing.assert_close(
        k_student.bias[:16], (k_teacher.bias[:16] + k_teacher.bias[16:32]) / 2
    )
    assert kv_clusters(4, 3) == [[0, 1], [2], [3]]


def test_hidden_pruning_slices_every_site_and_keeps_tying(tmp_path):
    teacher = tiny_model("qwen3", tied=True)
    imp = compute_importance(teacher, _batches(), removal_batches=0)
    spec = arch_spec_of(teacher).model_copy(update={"hidden_size": 40})
    student = prune(teacher, imp, spec)
    keep = torch.sort(imp.hidden_order()[:40]).values
    assert student.lm_head.weight.data_ptr() == student.model.embed_tokens.weight.data_ptr()
    torch.testing.assert_close(
        student.model.embed_tokens.weight, teacher.model.embed_tokens.weight[:, keep]
    )
    torch.testing.assert_close(student.model.norm.weight, teacher.model.norm.weight[keep])
    s_layer, t_layer = student.model.layers[2], teacher.model.layers[2]
    torch.testing.assert_close(s_layer.mlp.down_proj.weight, t_layer.mlp.down_proj.weight[keep])
    torch.testing.assert_close(s_layer.self_attn.q_norm.weight, t_layer.self_attn.q_norm.weight)
    assert sum(p.numel() for p in student.parameters()) == spec.num_params()
    student.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    ids = _batches(count=1)[0]
    torch.testing.assert_close(_logits(loaded, ids), _logits(student, ids), rtol=0, atol=0)


def test_dropping_an_identity_layer_is_exact():
    teacher = tiny_model("mistral", num_layers=4)
    with torch.no_grad():
        teacher.model.layers[1].self_attn.o_proj.weight.zero_()
        teacher.model.layers[1].mlp.down_proj.weight.zero_()
    imp = compute_importance(teacher, _batches(), removal_batches=0)
    spec = arch_spec_of(teacher)
    shorter = spec.model_copy(update={"layers": spec.layers[:3]})
    student = prune(teacher, imp, shorter)
    assert student.config.source_layers == [0, 2, 3]
    ids = _batches(count=1)[0]
    torch.testing.assert_close(_logits(student, ids), _logits(teacher, ids), rtol=0, atol=1e-5)


def test_no_op_blocks_are_removed_with_their_norms():
    teacher = tiny_model("llama")
    spec = ArchSpec(hidden_size=64, layers=[_layer(4, 2, 0), _layer(0, 0, 96), _layer(0, 0, 0)])
    student = prune(teacher, random_importance(teacher), spec)
    layer0, layer1 = student.model.layers[0], student.model.layers[1]
    assert layer0.mlp is None and layer0.post_attention_layernorm is None
    assert layer1.self_attn is None and layer1.input_layernorm is None
    assert (
        sum(p.numel() for p in student.parameters())
        == spec.complete_from(arch_spec_of(teacher)).num_params()
    )
    # An identity layer plus the removed blocks: equals the teacher with those blocks zeroed.
    masked = type(teacher)(teacher.config)
    masked.load_state_dict(teacher.state_dict())
    with torch.no_grad():
        masked.model.layers[0].mlp.down_proj.weight.zero_()
        masked.model.layers[1].self_attn.o_proj.weight.zero_()
        masked.model.layers[2].self_attn.o_proj.weight.zero_()
        masked.model.layers[2].mlp.down_proj.weight.zero_()
    ids = _batches(count=1)[0]
    torch.testing.assert_close(
        _logits(student, ids), _logits(masked.eval(), ids), rtol=0, atol=1e-5
    )


def test_prune_rejects_what_it_cannot_build():
    teacher = tiny_model("llama")
    imp = random_importance(teacher)
    spec = arch_spec_of(teacher)
    wider = spec.model_copy(update={"layers": [_layer(4, 2, 128)] * 3})
    with pytest.raises(AutoCompressError, match="layer 0: intermediate_size 128"):
        prune(teacher, imp, wider)
    other = random_importance(tiny_model("llama", num_layers=2))
    with pytest.raises(AutoCompressError, match="different shape"):
        prune(teacher, other, spec)
    uneven = spec.model_copy(update={"layers": [_layer(4, 4, 96)] * 3})  # 4 KV > teacher's 2
    with pytest.raises(AutoCompressError, match="KV heads exceed"):
        prune(teacher, imp, uneven)
    # A pruned model cannot regrow a removed block.
    student = prune(teacher, imp, ArchSpec(hidden_size=64, layers=[_layer(4, 2, 0)] * 3))
    with pytest.raises(AutoCompressError, match="no such block"):
        prune(student, random_importance(student), spec)
    layers = [_layer(4, 2, 0), _layer(4, 2, 96), _layer(4, 2, 96)]
    student = prune(teacher, imp, ArchSpec(hidden_size=64, layers=layers))
    with pytest.raises(AutoCompressError, match="layer 0: teacher layer 0 has no block to keep"):
        prune(student, random_importance(student), spec)
