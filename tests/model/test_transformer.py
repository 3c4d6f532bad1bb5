"""The ranker: shapes, causality, padding invariance, tied head, position variants."""

import pytest
import torch

from recsys_alibi.config import ModelConfig
from recsys_alibi.model.transformer import AlibiRanker


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


def test_padding_and_future_do_not_change_a_users_scores():
    model = _model()
    alone = model.score(torch.tensor([[3, 4, 5]]), torch.tensor([3]))
    padded = model.score(torch.tensor([[3, 4, 5, 9, 9, 0]]), torch.tensor([3]))
    torch.testing.assert_close(alone, padded, atol=1e-5, rtol=1e-5)
    hidden_short = model.encode(torch.tensor([[3, 4, 5]]), torch.tensor([3]))
    hidden_long = model.encode(torch.tensor([[3, 4, 5, 8, 2]]), torch.tensor([5]))
    torch.testing.assert_close(hidden_short, hidden_long[:, :3], atol=1e-5, rtol=1e-5)  # causal


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_backends_agree_inside_the_model(backend):
    model = _model()
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


def test_packed_rows_give_each_user_the_hidden_states_it_has_alone():
    model = _model()
    a, b = torch.tensor([3, 4, 5]), torch.tensor([9, 8])
    tokens = torch.tensor([[3, 4, 5, 9, 8, 0]])
    seq_ids = torch.tensor([[1, 1, 1, 2, 2, 0]])
    packed = model.encode(tokens, torch.tensor([5]), seq_ids)
    alone_a = model.encode(a[None], torch.tensor([3]))
    alone_b = model.encode(b[None], torch.tensor([2]))
    torch.testing.assert_close(packed[:, :3], alone_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[:, 3:5], alone_b, atol=1e-5, rtol=1e-5)
