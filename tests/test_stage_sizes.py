"""Stage sizes follow the teacher's size; the bundled teacher's defaults do not move."""

from autocompress.arch_search.config import SearchConfig
from autocompress.distill import DistillConfig
from autocompress.evaluation.suite import EvalConfig
from autocompress.importance import CalibrationConfig
from autocompress.stage_sizes import (
    REFERENCE_PARAMS,
    distill_sizes,
    eval_sizes,
    importance_sizes,
    search_sizes,
    token_scale,
    with_defaults,
)


def test_small_teachers_keep_every_default():
    for params in (None, 7_100_000, REFERENCE_PARAMS):
        assert token_scale(params) == 1.0
        assert importance_sizes(params) == search_sizes(params) == eval_sizes(params) == {}
        assert distill_sizes(params) == {}


def test_a_135m_teacher_reads_fewer_tokens_but_not_below_the_floors():
    params = 134_515_008
    assert abs(token_scale(params) - (REFERENCE_PARAMS / params) ** 0.5) < 1e-12
    calib = CalibrationConfig.model_validate(importance_sizes(params))
    assert 2 <= calib.batch_size < CalibrationConfig().batch_size
    search = SearchConfig.model_validate(search_sizes(params))
    assert 2 <= search.dnas.batch_size < SearchConfig().dnas.batch_size
    assert search.calibration.removal_batches == SearchConfig().calibration.removal_batches
    short, reference = search.minitron, SearchConfig().minitron
    assert short.distill_tokens < reference.distill_tokens
    steps = short.distill_tokens / (short.distill_batch_size * short.distill_seq_len)
    assert abs(steps - reference.distill_tokens / (
        reference.distill_batch_size * reference.distill_seq_len)) <= 1
    distill = DistillConfig.model_validate({"tokens": 1, **distill_sizes(params)})
    assert 2 <= distill.eval_batches < DistillConfig(tokens=1).eval_batches
    suite = EvalConfig.model_validate(eval_sizes(params))
    assert 60 <= suite.num_items < EvalConfig().num_items
    # A 100B teacher hits the floors instead of scoring nothing.
    huge = EvalConfig.model_validate(eval_sizes(100e9))
    assert (huge.num_items, huge.next_token_windows) == (60, 24)


def test_explicit_options_win_over_scaled_sizes():
    merged = with_defaults({"dnas": {"steps": 40}, "score_batches": 2},
                           search_sizes(134_515_008))
    assert merged["dnas"] == {"batch_size": 2, "steps": 40}
    assert merged["minitron"]["distill_batch_size"] == 2
    assert merged["score_batches"] == 2
    assert with_defaults({"dnas": {"batch_size": 8}}, search_sizes(1e9))["dnas"] == {
        "batch_size": 8}
