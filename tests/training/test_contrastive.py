"""The auxiliary contrastive loss: values against a loop written from its definition, and in training."""

from __future__ import annotations

import math

import pytest
import torch
from training_fixtures import tiny_config, write_walks

from recsys_alibi.config import ConfigError, load_config
from recsys_alibi.training.contrastive import contrastive_loss, sample_positions


def reference(a: torch.Tensor, b: torch.Tensor, targets: torch.Tensor, temperature: float, cosine=False) -> float:
    """-log(sum over positives / sum over the others), one view at a time, in float64 loops."""
    z = torch.cat([a, b]).double()
    if cosine:
        z = torch.stack([v / math.sqrt(float(v @ v)) for v in z])
    labels = torch.cat([targets, targets]).tolist()
    total = 0.0
    for i in range(z.shape[0]):
        others = [j for j in range(z.shape[0]) if j != i]
        sims = {j: float(z[i] @ z[j]) / temperature for j in others}
        positives = [j for j in others if labels[j] == labels[i]]
        total += -math.log(sum(math.exp(sims[j]) for j in positives) / sum(math.exp(s) for s in sims.values()))
    return total / z.shape[0]


def test_hand_computed_two_positions():
    # a = b = the unit vectors e1, e2; distinct targets. View 0 (e1) has candidates e2 (sim 0),
    # e1 (its other view, sim 1), e2 (sim 0): loss = -log(e / (e + 2)); the same for all four views.
    a = torch.eye(2)
    loss = contrastive_loss(a, a.clone(), torch.tensor([3, 4]), temperature=1.0)
    assert loss.item() == pytest.approx(-math.log(math.e / (math.e + 2)), rel=1e-6)


def test_same_target_positions_are_positives():
    # with one target shared by both positions every other view is a positive: the loss is 0
    a = torch.randn(2, 3)
    loss = contrastive_loss(a, torch.randn(2, 3), torch.tensor([5, 5]), temperature=0.5)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.2])
@pytest.mark.parametrize("cosine", [False, True])
def test_matches_the_loop_reference(temperature, cosine):
    g = torch.Generator().manual_seed(0)
    a, b = 3 * torch.randn(7, 5, generator=g), torch.randn(7, 5, generator=g)
    targets = torch.tensor([1, 2, 2, 3, 4, 4, 4])
    got = contrastive_loss(a, b, targets, temperature, cosine=cosine).item()
    assert got == pytest.approx(reference(a, b, targets, temperature, cosine), rel=1e-5)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="T >= 1"):
        contrastive_loss(torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), 1.0)
    with pytest.raises(ValueError, match="T >= 1"):
        contrastive_loss(torch.zeros(2, 3), torch.zeros(3, 3), torch.ones(2, dtype=torch.long), 1.0)
    with pytest.raises(ValueError, match="temperature"):
        contrastive_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, dtype=torch.long), 0.0)


def test_sample_positions():
    assert sample_positions(5, 8, torch.device("cpu")) is None
    torch.manual_seed(0)
    chosen = sample_positions(100, 10, torch.device("cpu"))
    assert chosen.shape == (10,) and chosen.unique().numel() == 10 and int(chosen.max()) < 100


def test_refused_with_a_sharded_table():
    with pytest.raises(ConfigError, match="contrastive_weight needs the dense item table"):
        load_config(None, ["train.contrastive_weight=0.1", "model.shard_embeddings=true"])


def test_training_step_adds_the_weighted_term(tmp_path):
    """The step's loss is the softmax loss plus weight x the contrastive loss of a second dropout pass."""
    from recsys_alibi.training.datamodule import SequenceDataModule
    from recsys_alibi.training.module import RankerModule

    prepared = write_walks(tmp_path / "prepared")
    steps = {}
    for weight in (0.0, 0.5):
        config = tiny_config(tmp_path / "out", "train.packing=true", f"train.contrastive_weight={weight}")
        datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
        datamodule.setup("fit")
        batch = next(iter(datamodule.train_dataloader()))
        torch.manual_seed(0)
        module = RankerModule(config.model, config.train, datamodule.n_items, seed=config.seed)
        module.configure_model()
        module.log = lambda *args, **kwargs: None
        module.train()
        torch.manual_seed(1)
        steps[weight] = (module, batch, module.training_step(batch, 0))
    module, batch, loss = steps[0.5]
    # the same two passes by hand: the first dropout mask is the plain step's, the second a new one
    torch.manual_seed(1)
    encode = lambda: module.model.encode(batch["inputs"], batch["lengths"], batch.get("seq_ids")).flatten(0, 1)
    first, second = encode(), encode()
    targets = batch["targets"].flatten()
    where = batch["target_positions"]
    first, second, targets = first[where], second[where], targets[where]
    keep = targets > 0
    term = contrastive_loss(first[keep], second[keep], targets[keep], 1.0)
    assert term.item() > 0.1
    assert loss.item() == pytest.approx(steps[0.0][2].item() + 0.5 * term.item(), rel=1e-5)
    loss.backward()  # gradients flow through both passes
    assert all(p.grad is not None for p in module.model.parameters() if p.requires_grad and p.dim() > 1)
