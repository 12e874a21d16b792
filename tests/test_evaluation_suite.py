"""The evaluation suite end to end on tiny random models (real lm-eval, real transformers).

A tiny corpus of real standard-library files, a BPE tokenizer trained on it,
and a random ``LlamaForCausalLM``: the suite must run offline, return the
documented JSON, put a random model near chance, compute bits per byte exactly
(no BOS counted twice), work unchanged for our heterogeneous model class, and
turn unknown / unreachable benchmarks into one-line errors.
"""

from __future__ import annotations

import json
import math
import sysconfig
from pathlib import Path

import pytest
import torch
from tokenizers import processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from autocompress.data.corpus import build_corpus, load_documents
from autocompress.data.tokenizer import train_tokenizer
from autocompress.errors import AutoCompressError
from autocompress.evaluation import (
    LOCAL_TASKS,
    MINITRON_TASKS,
    EvalConfig,
    evaluate,
    heldout,
    heldout_loss,
    write_json,
)
from autocompress.evaluation.suite import expand_tasks

STDLIB = Path(sysconfig.get_paths()["stdlib"])
# The corpus splits by a hash of the path; these land in held-out / calibration / train.
HELDOUT = ["glob.py", "queue.py", "heapq.py"]
CALIBRATION = ["colorsys.py"]
TRAIN = ["bisect.py", "reprlib.py", "linecache.py", "fnmatch.py", "genericpath.py"]
SMALL = EvalConfig(num_items=24, bpb_bytes=12_000, next_token_windows=8, seq_len=128)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("eval")
    with (root / "src.jsonl").open("w") as fh:
        for name in HELDOUT + CALIBRATION + TRAIN:
            fh.write(json.dumps({"path": name, "text": (STDLIB / name).read_text()}) + "\n")
    corpus = root / "corpus"
    manifest = build_corpus(corpus, source=str(root / "src.jsonl"))
    assert manifest.num_files["heldout"] == len(HELDOUT)
    tok = train_tokenizer([d.text for d in load_documents(corpus, "train")], vocab_size=512)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    result = evaluate(model, tok, corpus_dir=corpus, config=SMALL, work_dir=root / "work")
    return {"root": root, "corpus": corpus, "tok": tok, "model": model, "result": result}


def test_result_has_the_documented_keys(setup, tmp_path):
    result = setup["result"]
    for key in ("model", "tasks", "mc_mean", "mc_chance_mean", "bits_per_byte",
                "bits_per_byte_stderr", "next_token_acc", "next_token_acc_stderr",
                "heldout_loss", "details"):
        assert key in result, key
    assert set(result["tasks"]) == {"next_line", "identifier", "docstring", "indent"}
    for name, entry in result["tasks"].items():
        assert 0.0 <= entry["score"] <= 1.0, name
        assert entry["stderr"] is not None and entry["stderr"] > 0, name
        assert entry["chance"] == pytest.approx(0.25)
        assert entry["n"] == SMALL.num_items
    assert result["mc_chance_mean"] == pytest.approx(0.25)
    assert result["mc_mean"] == pytest.approx(
        sum(e["score"] for e in result["tasks"].values()) / 4)
    # Per-item scores (for paired comparisons): each item's metric, by the item's id.
    per_item = result["per_item"]
    assert set(per_item) == {*result["tasks"], "heldout_loss"}
    for name, entry in result["tasks"].items():
        items = per_item[name]
        assert len(items) == SMALL.num_items and set(items.values()) <= {0.0, 1.0}
        assert sum(items.values()) / len(items) == pytest.approx(entry["score"])
    windows = list(per_item["heldout_loss"].values())
    assert len(windows) == SMALL.next_token_windows
    assert sum(windows) / len(windows) == pytest.approx(result["heldout_loss"], rel=1e-5)
    path = write_json(result, tmp_path / "out" / "eval.json")
    assert json.loads(path.read_text())["tasks"].keys() == result["tasks"].keys()
    assert not list(path.parent.glob("*.tmp*"))


def test_random_model_is_near_chance(setup):
    result = setup["result"]
    # 4 x 24 items: the mean's stderr is ~0.045; a random model has no business
    # being far from 1/4 (the bound is loose on purpose).
    assert abs(result["mc_mean"] - 0.25) < 0.17
    assert result["next_token_acc"] < 0.2
    # Random logits: the loss is near ln(vocab), bits/byte far above a trained model's ~1.
    assert result["heldout_loss"] == pytest.approx(math.log(len(setup["tok"])), rel=0.2)
    assert result["bits_per_byte"] > 2.0


def _direct_bits_per_byte(model, tok, chunks, seq_len):
    """Independent computation: each chunk after the EOS prefix token, disjoint windows."""
    nll, nbytes = 0.0, 0
    for text in chunks:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        seq = [tok.eos_token_id] + ids
        for start in range(0, len(ids), seq_len):
            inp = torch.tensor([seq[start:start + seq_len]])
            target = torch.tensor(ids[start:start + seq_len])
            with torch.no_grad():
                logp = torch.log_softmax(model(inp).logits[0].float(), -1)
            nll -= float(logp[torch.arange(len(target)), target].sum())
        nbytes += len(text.encode())
    return nll / math.log(2) / nbytes


def test_bits_per_byte_is_exact_and_counts_no_bos(setup):
    model, tok, corpus = setup["model"], setup["tok"], setup["corpus"]
    chunks = heldout.heldout_chunks(load_documents(corpus, "heldout"), SMALL.bpb_bytes)
    expected = _direct_bits_per_byte(model, tok, chunks, SMALL.seq_len)
    assert setup["result"]["bits_per_byte"] == pytest.approx(expected, rel=1e-4)

    # The same tokenizer with a post-processor that prepends BOS must give the
    # same number: the suite asks lm-eval not to add special tokens to documents.
    backend = tok.backend_tokenizer.__class__.from_str(tok.backend_tokenizer.to_str())
    backend.post_processor = processors.TemplateProcessing(
        single=f"{tok.bos_token} $A", special_tokens=[(tok.bos_token, tok.bos_token_id)])
    bos_tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=tok.bos_token,
                                      eos_token=tok.eos_token, pad_token=tok.pad_token)
    assert bos_tok("x = 1")["input_ids"][0] == tok.bos_token_id
    again = evaluate(model, bos_tok, tasks="heldout", corpus_dir=corpus, config=SMALL,
                     work_dir=setup["root"] / "work")
    assert again["bits_per_byte"] == pytest.approx(expected, rel=1e-4)
    assert again["tasks"] == {} and again["mc_mean"] is None


def test_heldout_loss_is_deterministic(setup):
    model, tok, corpus = setup["model"], setup["tok"], setup["corpus"]
    a = heldout_loss(model, tok, corpus, max_batches=2, seq_len=64, batch_size=4)
    b = heldout_loss(model, tok, corpus, max_batches=2, seq_len=64, batch_size=4)
    assert a == b and math.isfinite(a)
    other = heldout_loss(model, tok, corpus, max_batches=2, seq_len=64, batch_size=4, seed=1)
    assert other != a  # other windows


def test_heterogeneous_model_gives_identical_scores(setup):
    # Nothing in the suite may depend on a known model_type: the converted
    # model (model_type autocompress_hetero, same logits) scores exactly the same.
    from autocompress.modeling import to_hetero

    hetero = to_hetero(setup["model"]).eval()
    assert hetero.config.model_type != setup["model"].config.model_type
    result = evaluate(hetero, setup["tok"], corpus_dir=setup["corpus"], config=SMALL,
                      work_dir=setup["root"] / "work")
    ref = setup["result"]
    for name, entry in ref["tasks"].items():
        assert result["tasks"][name]["score"] == pytest.approx(entry["score"]), name
    assert result["bits_per_byte"] == pytest.approx(ref["bits_per_byte"], rel=1e-5)
    assert result["heldout_loss"] == pytest.approx(ref["heldout_loss"], rel=1e-5)


def test_unknown_and_unsafe_benchmarks_are_one_line_errors(setup):
    kwargs = dict(corpus_dir=setup["corpus"], config=SMALL, work_dir=setup["root"] / "work")
    with pytest.raises(AutoCompressError, match="unknown benchmark 'no_such_benchmark'") as err:
        evaluate(setup["model"], setup["tok"], tasks="local,no_such_benchmark", **kwargs)
    assert "\n" not in str(err.value) and err.value.hint
    with pytest.raises(AutoCompressError, match="'humaneval' executes code"):
        evaluate(setup["model"], setup["tok"], tasks="humaneval", **kwargs)
    with pytest.raises(AutoCompressError, match="leaves no items"):  # not lm-eval's crash
        evaluate(setup["model"], setup["tok"], limit=0, **kwargs)


def test_task_sets_expand_in_order():
    local, run_heldout, std = expand_tasks("minitron,docstring,local")
    assert std == list(MINITRON_TASKS) and len(std) == 8
    assert local == ["docstring", "next_line", "identifier", "indent"] and run_heldout
    assert expand_tasks(None) == (list(LOCAL_TASKS), True, [])
    assert expand_tasks(["heldout"]) == ([], True, [])


def test_unreachable_benchmark_is_a_one_line_error(setup, monkeypatch, tmp_path):
    # No network and an empty Hugging Face cache: hellaswag cannot be loaded.
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(AutoCompressError, match="'hellaswag' is unavailable") as err:
        evaluate(setup["model"], setup["tok"], tasks=["hellaswag"], corpus_dir=setup["corpus"],
                 config=SMALL, work_dir=setup["root"] / "work")
    assert "\n" not in str(err.value)
    assert "Rowan/hellaswag" in err.value.message


def test_cli_eval_writes_json_and_prints_table(setup, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from autocompress.cli import app

    monkeypatch.setenv("AUTOCOMPRESS_HOME", str(tmp_path / "home"))
    model_dir = tmp_path / "model"
    setup["model"].save_pretrained(model_dir)
    setup["tok"].save_pretrained(model_dir)
    out = tmp_path / "eval.json"
    runner = CliRunner()
    res = runner.invoke(app, ["eval", "--model", str(model_dir), "--json", str(out),
                              "--data", str(setup["corpus"]), "--config", "num_items=16",
                              "--config", "limit=8", "--config", "seq_len=128",
                              "--config", "device=cpu"])
    assert res.exit_code == 0, res.output
    assert "multiple-choice mean" in res.output and "bits/byte" in res.output
    data = json.loads(out.read_text())
    assert data["model"] == str(model_dir)
    assert set(data["tasks"]) == {"next_line", "identifier", "docstring", "indent"}
    assert all(e["n"] == 8 for e in data["tasks"].values())

    res = runner.invoke(app, ["eval", "--model", str(tmp_path / "missing")])
    assert isinstance(res.exception, AutoCompressError)
    assert "does not exist" in res.exception.message


def test_context_reuse_scores_like_lm_eval_per_choice(setup):
    # The suite scores a multiple-choice item's context once for all its choices
    # (context_cache.ContextCachedLM); lm-eval's own path runs it once per choice.
    mc = ",".join(LOCAL_TASKS)
    per_choice = evaluate(setup["model"], setup["tok"], mc, corpus_dir=setup["corpus"],
                          config=SMALL.model_copy(update={"reuse_context": False}),
                          work_dir=setup["root"] / "work")
    for name, entry in setup["result"]["tasks"].items():
        for metric in ("score", "acc", "acc_norm"):  # whichever the task reports
            assert entry.get(metric) == per_choice["tasks"][name].get(metric), (name, metric)


def test_context_cache_matches_per_request_loglikelihoods():
    # Request level, on a heterogeneous model with a removed attention block and
    # continuations of different lengths; single requests and over-long pairs take
    # lm-eval's path.
    from autocompress.arch import ArchSpec
    from autocompress.evaluation.harness import make_lm
    from autocompress.modeling import build_model

    spec = ArchSpec.uniform(num_layers=3, hidden_size=32, num_heads=4, num_kv_heads=2,
                            intermediate_size=48, head_dim=8, vocab_size=96)
    layers = list(spec.layers)
    layers[1] = layers[1].model_copy(update={"attention": None})
    model = build_model(spec.model_copy(update={"layers": layers}), None, seed=3).eval()
    tok = PreTrainedTokenizerFast(tokenizer_object=_byte_level_tokenizer(96))
    g = torch.Generator().manual_seed(0)

    def ids(n):
        return torch.randint(3, 96, (n,), generator=g).tolist()

    requests = []
    for context_len in (2, 9, 30):
        context = ids(context_len)
        requests += [((None, None), context, ids(n)) for n in (1, 3, 4, 7)]
    requests.append(((None, None), ids(5), ids(2)))  # alone: lm-eval's path
    long_context = ids(60)
    requests += [((None, None), long_context, ids(n)) for n in (3, 8)]  # truncated at 64
    with torch.inference_mode():
        cached = make_lm(model, tok, batch_size=4, max_length=64)._loglikelihood_tokens(requests)
        plain = make_lm(model, tok, batch_size=4, max_length=64,
                        reuse_context=False)._loglikelihood_tokens(requests)
    assert [g for _, g in cached] == [g for _, g in plain]
    assert [ll for ll, _ in cached] == pytest.approx([ll for ll, _ in plain], abs=1e-4)


def _byte_level_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, models

    return Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
