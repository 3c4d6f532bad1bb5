"""The ranker: shapes, causality, padding invariance, tied head, position variants."""

import pytest
import torch

from recsys_alibi.config import ModelConfig
from recsys_alibi.model.alibi import free_head_query_scale
from recsys_alibi.model.transformer import AlibiRanker, query_positions

LOG_FREE = {"free_heads": 2, "free_head_scale": "log_beyond"}  # two content-only heads, log-length scaled past max_len
LOWPASS = {"lowpass_window": 2, "lowpass_mix": 0.5}  # the causal low-pass branch beside attention


def _model(**kw) -> AlibiRanker:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_layers=2, n_heads=4, max_len=12, dropout=0.0, attention_backend="sdpa", **kw)
    return AlibiRanker(cfg, n_items=30).eval()


def test_scores_have_catalog_width_and_come_from_the_tied_table():
    model = _model()
    history = torch.tensor([[3, 4, 5, 0], [7, 0, 0, 0]])
    lengths = torch.tensor([3, 1])
    scores = model.score(history, lengths)
    assert scores.shape == (2, 31) and scores.dtype == torch.float32
    hidden = model.last_hidden(history, lengths)
    torch.testing.assert_close(scores, hidden @ model.items.weight.T)


@pytest.mark.parametrize("kw", [{}, LOG_FREE, LOWPASS], ids=["default", "log-free-heads", "lowpass"])
def test_padding_and_future_do_not_change_a_users_scores(kw):
    model = _model(**kw)
    alone = model.score(torch.tensor([[3, 4, 5]]), torch.tensor([3]))
    padded = model.score(torch.tensor([[3, 4, 5, 9, 9, 0]]), torch.tensor([3]))
    torch.testing.assert_close(alone, padded, atol=1e-5, rtol=1e-5)
    hidden_short = model.encode(torch.tensor([[3, 4, 5]]), torch.tensor([3]))
    hidden_long = model.encode(torch.tensor([[3, 4, 5, 8, 2]]), torch.tensor([5]))
    torch.testing.assert_close(hidden_short, hidden_long[:, :3], atol=1e-5, rtol=1e-5)  # causal


@pytest.mark.parametrize("kw", [{}, LOG_FREE, LOWPASS], ids=["default", "log-free-heads", "lowpass"])
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_backends_agree_inside_the_model(backend, kw):
    model = _model(**kw)
    history = torch.randint(1, 31, (3, 9))
    lengths = torch.tensor([9, 5, 2])
    reference = model.encode(history, lengths, backend="eager")
    torch.testing.assert_close(model.encode(history, lengths, backend=backend), reference, atol=1e-5, rtol=1e-5)


def test_alibi_extrapolates_past_max_len_but_learned_positions_refuse():
    long_history = torch.randint(1, 31, (1, 40))
    assert _model().score(long_history, torch.tensor([40])).shape == (1, 31)
    learned = _model(position="learned")
    assert learned.max_context == 12
    with pytest.raises(ValueError, match="learned positions cover 12"):
        learned.score(long_history, torch.tensor([40]))


def test_attention_weights_rows_sum_to_one_and_are_causal():
    model = _model()
    weights = model.attention_weights(torch.tensor([[1, 2, 3, 0]]), torch.tensor([3]))
    assert len(weights) == 2 and weights[0].shape == (1, 4, 4, 4)
    w = weights[0][0, :, :3, :3]
    torch.testing.assert_close(w.sum(-1), torch.ones(4, 3))
    assert torch.all(w.triu(diagonal=1) == 0)


def test_gradients_reach_the_rows_looked_up_and_slopes_when_learnable():
    model = _model(learnable_slopes=True).train()
    scores = model.score(torch.tensor([[1, 2, 3]]), torch.tensor([3]))
    scores[0, 5].backward()
    assert model.slopes.parameters().__next__().grad is not None
    assert model.items.weight.grad is not None


@pytest.mark.parametrize("kw", [{}, LOG_FREE, LOWPASS, {"position": "learned"}],
                         ids=["default", "log-free-heads", "lowpass", "learned-positions"])
def test_packed_rows_give_each_user_the_hidden_states_it_has_alone(kw):
    model = _model(**kw)
    a, b = torch.tensor([3, 4, 5]), torch.tensor([9, 8])
    tokens = torch.tensor([[3, 4, 5, 9, 8, 0]])
    seq_ids = torch.tensor([[1, 1, 1, 2, 2, 0]])
    packed = model.encode(tokens, torch.tensor([5]), seq_ids)
    alone_a = model.encode(a[None], torch.tensor([3]))
    alone_b = model.encode(b[None], torch.tensor([2]))
    torch.testing.assert_close(packed[:, :3], alone_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[:, 3:5], alone_b, atol=1e-5, rtol=1e-5)


def test_query_positions_restart_at_every_packed_sequence():
    assert query_positions(4, None, torch.device("cpu")).tolist() == [[0, 1, 2, 3]]
    seq_ids = torch.tensor([[1, 1, 2, 2, 2, 0], [3, 3, 3, 3, 4, 4]])
    assert query_positions(6, seq_ids, torch.device("cpu")).tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 0, 1]]


def test_log_beyond_keeps_a_free_heads_weight_on_one_key_as_the_context_grows():
    # one free head whose query matches one key (content margin m); n - 1 others score 0. Unscaled the
    # weight is e^m / (e^m + n - 1), falling with n; scaled by log(n) / log(max_len) it grows with n.
    cfg = ModelConfig(d_model=4, n_heads=1, n_layers=1, max_len=16, free_heads=1, free_head_scale="log_beyond",
                      dropout=0.0, attention_backend="eager")  # fmt: skip
    weights = {}
    for n in (16, 256, 2048):
        scale = free_head_query_scale(cfg, torch.tensor([[n - 1]]))[0, 0, 0, 0].item()
        margin = 4.0 * scale  # the content margin 4 at the training length, scaled at the query
        weights[n] = (torch.exp(torch.tensor(margin)) / (torch.exp(torch.tensor(margin)) + n - 1)).item()
        unscaled = (torch.exp(torch.tensor(4.0)) / (torch.exp(torch.tensor(4.0)) + n - 1)).item()
        assert weights[n] >= unscaled - 1e-7
    assert weights[16] < weights[256] < weights[2048]


def test_log_beyond_is_one_within_the_training_length_and_log_ratio_past_it():
    cfg = ModelConfig(d_model=16, n_heads=4, max_len=8, free_heads=2, free_head_scale="log_beyond")
    scale = free_head_query_scale(cfg, torch.tensor([[0, 3, 7, 15, 63]]))  # n = 1, 4, 8, 16, 64 keys
    torch.testing.assert_close(scale[0, 2:, :, 0], torch.tensor([[1.0, 1.0, 1.0, 4 / 3, 2.0]] * 2))  # log2(n) / 3
    assert torch.all(scale[0, :2] == 1)  # the two position-biased heads (the steepest) keep factor 1
    assert free_head_query_scale(ModelConfig(free_heads=1), torch.tensor([[0, 1]])) is None  # off by default
    with pytest.raises(ValueError, match="set model.free_heads >= 1"):
        ModelConfig(free_head_scale="log_beyond")


def test_log_beyond_scores_like_unscaled_free_heads_within_the_training_length_only():
    plain, beyond = _model(free_heads=2), _model(free_heads=2, free_head_scale="log_beyond")
    beyond.load_state_dict(plain.state_dict())  # the same weights: the option has no parameters
    short = torch.randint(1, 31, (2, 12))  # = max_len
    lengths = torch.tensor([12, 7])
    torch.testing.assert_close(beyond.score(short, lengths), plain.score(short, lengths))
    long = torch.randint(1, 31, (1, 40))
    assert not torch.allclose(beyond.score(long, torch.tensor([40])), plain.score(long, torch.tensor([40])))


def test_a_learned_position_table_that_cannot_be_allocated_is_a_one_line_error():
    # model.max_len=1e12 with position=learned was a DefaultCPUAllocator traceback (exit 1); ALiBi has no table
    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=1, max_len=10**12, position="learned")
    with pytest.raises(ValueError) as info:
        AlibiRanker(cfg, 10)
    assert str(info.value).startswith("model.max_len=1000000000000 with model.position=learned needs a position table "
                                      "of 59,604.6 GiB (max_len x d_model float32), which cannot be allocated here")
