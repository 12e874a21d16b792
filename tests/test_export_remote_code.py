"""The nemotron-nas export's remote code: its config under transformers 4.x and 5.x
semantics, and ``AutoModelForCausalLM`` loading with ``trust_remote_code``."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.abc
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from autocompress.arch import ArchSpec, AttentionSpec, FFNSpec, LayerSpec
from autocompress.export import export_nemotron_nas
from autocompress.importance import random_importance
from autocompress.modeling.configuration_decilm import DeciLMConfig
from autocompress.modeling.tiny import tiny_model
from autocompress.prune import prune

torch.set_num_threads(1)


def _layer(heads, kv, width):
    attention = AttentionSpec(num_heads=heads, num_kv_heads=kv) if heads else None
    return LayerSpec(attention=attention, ffn=FFNSpec(intermediate_size=width) if width else None)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """A pruned tiny Llama (GQA, a layer without attention) and its nemotron-nas export."""
    tmp = tmp_path_factory.mktemp("decilm")
    teacher = tiny_model("llama", tied=True, gqa_ratio=1, intermediate_size=512)
    layers = [_layer(4, 4, 512), _layer(4, 1, 256), _layer(0, 0, 256)]
    student = prune(teacher, random_importance(teacher), ArchSpec(hidden_size=64, layers=layers))
    student.save_pretrained(tmp / "student")
    export_nemotron_nas(tmp / "student", tmp / "nas")
    return student, tmp / "nas"


class _BlockAutocompress(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "autocompress" or name.startswith("autocompress."):
            raise ImportError(f"{name} is hidden from remote code in this test")


@contextlib.contextmanager
def _autocompress_hidden():
    """Make ``import autocompress...`` fail (even for modules already imported)."""
    saved = {k: m for k, m in sys.modules.items() if k.split(".")[0] == "autocompress"}
    for name in saved:
        del sys.modules[name]
    blocker = _BlockAutocompress()
    sys.meta_path.insert(0, blocker)
    try:
        yield
    finally:
        sys.meta_path.remove(blocker)
        sys.modules.update(saved)


def test_remote_code_gives_the_compressed_models_logits(export):
    student, nas = export
    config = json.loads((nas / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_decilm.DeciLMForCausalLM"
    ids = torch.randint(3, 128, (2, 9))
    with torch.no_grad():
        expected = student(ids).logits
    with _autocompress_hidden():
        model = AutoModelForCausalLM.from_pretrained(nas, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules")
        with torch.no_grad():
            got = model(ids).logits
            # Cached decoding agrees with one full pass (layer 2 has no attention).
            first = model(ids[:, :5], use_cache=True)
            step = model(ids[:, 5:], cache=first.cache).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(step, expected[:, 5:], rtol=0, atol=1e-5)


@dataclasses.dataclass(frozen=True)
class _Attention:  # the shape of the hub's frozen block_config dataclasses
    no_op: bool = False
    replace_with_linear: bool = False
    n_heads_in_group: int | None = 2


@dataclasses.dataclass(frozen=True)
class _FFN:
    no_op: bool = False
    replace_with_linear: bool = False
    ffn_mult: float | None = 1.5


@dataclasses.dataclass(frozen=True)
class _Block:
    attention: _Attention
    ffn: _FFN


def test_config_takes_dicts_and_objects_and_stays_serialisable():
    as_dicts = [dataclasses.asdict(_Block(_Attention(), _FFN()))] * 2
    as_objects = [_Block(_Attention(), _FFN()), _Block(_Attention(True, False, None), _FFN())]
    for blocks in (as_dicts, as_objects):
        config = DeciLMConfig(block_configs=blocks, hidden_size=64, num_attention_heads=4)
        assert config.num_hidden_layers == 2
        assert config.block_configs[0].attention.n_heads_in_group == 2
        assert config.block_configs[1]["ffn"]["ffn_mult"] == 1.5  # TensorRT-LLM reads dicts
        again = DeciLMConfig.from_dict(json.loads(config.to_json_string()))
        assert again.block_configs == config.block_configs
    # Assignment after construction wraps too (no __post_init__ involved).
    config.block_configs = as_dicts
    assert config.block_configs[1].ffn.ffn_mult == 1.5


# A stand-in for transformers 4.x's config machinery, written from 4.57's semantics:
# classic __init__ (no dataclass, __post_init__ never called); PretrainedConfig.__init__
# sets every unknown kwarg with setattr; from_dict is cls(**dict); to_dict deep-copies
# __dict__. (A real transformers 4.57.1, installed aside, was also run by hand on an
# export: the README's export section says what it showed.)
_TRANSFORMERS_4 = """
import copy

class PretrainedConfig:
    model_type = ""
    attribute_map = {}

    def __setattr__(self, key, value):
        key = type(self).attribute_map.get(key, key)
        object.__setattr__(self, key, value)

    def __init__(self, **kwargs):
        self.architectures = kwargs.pop("architectures", None)
        self.tie_word_embeddings = kwargs.pop("tie_word_embeddings", True)
        self.auto_map = kwargs.pop("auto_map", None)
        for key, value in kwargs.items():
            setattr(self, key, value)

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        return cls(**{**config_dict, **kwargs})

    def to_dict(self):
        output = copy.deepcopy(self.__dict__)
        output["model_type"] = self.__class__.model_type
        return output


class LlamaConfig(PretrainedConfig):
    model_type = "llama"

    def __init__(self, vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=None,
                 head_dim=None, rope_theta=10000.0, rope_scaling=None, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        super().__init__(**kwargs)
"""


def test_config_under_transformers_4_semantics(export, tmp_path):
    _, nas = export
    fake = tmp_path / "fake" / "transformers"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(_TRANSFORMERS_4)
    script = textwrap.dedent(
        f"""
        import dataclasses, importlib.util, json, sys
        import transformers
        assert transformers.__file__.startswith({str(tmp_path)!r}), transformers.__file__
        path = {str(nas / "configuration_decilm.py")!r}
        spec = importlib.util.spec_from_file_location("configuration_decilm", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert not hasattr(module.DeciLMConfig, "__dataclass_fields__")
        raw = json.load(open({str(nas / "config.json")!r}))
        config = module.DeciLMConfig.from_dict(raw)
        blocks = config.block_configs
        # vLLM nemotron_nas.py: attribute access, hasattr picks the FFN rule.
        print(blocks[0].attention.no_op, blocks[2].attention.no_op)
        print(hasattr(blocks[0].ffn, "ffn_mult"))
        print(config.num_attention_heads // blocks[1].attention.n_heads_in_group)
        # TensorRT-LLM convert.py: dicts (else dataclasses.asdict).
        print(isinstance(blocks[0], dict), blocks[2]["ffn"]["ffn_mult"] is not None)
        json.dumps(config.to_dict())
        config.block_configs = raw["block_configs"]  # PretrainedConfig.__init__'s setattr path
        print(config.block_configs[1].attention.n_heads_in_group)
        """
    )
    prelude = f"import sys; sys.path.insert(0, {str(fake.parent)!r})\n"
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", prelude + script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "True", "True", "1", "True", "True", "4"]


def test_auto_config_reads_the_export(export):
    _, nas = export
    config = AutoConfig.from_pretrained(nas, trust_remote_code=True)
    assert config.model_type == "nemotron-nas" and config.num_hidden_layers == 3
    assert config.block_configs[2].attention.no_op is True
    assert config.block_configs[1].attention.n_heads_in_group == 4
