"""The item table's two backends behind ``ItemEmbeddings``: torchrec and plain ``nn.Embedding``."""

from __future__ import annotations

import io
import json
import pickle

import pytest
import torch
from without_modules import run_without

from recsys_alibi.config import ConfigError, ModelConfig, load_config
from recsys_alibi.model.embeddings import PlainEmbeddingCollection, ItemEmbeddings, resolve_embedding_backend
from recsys_alibi.model.transformer import AlibiRanker

def _both(seed: int = 0, **kwargs) -> tuple[ItemEmbeddings, ItemEmbeddings]:
    torch.manual_seed(seed)
    torchrec = ItemEmbeddings(backend="torchrec", **kwargs)
    torch.manual_seed(seed)
    plain = ItemEmbeddings(backend="torch", **kwargs)
    return torchrec, plain


def test_plain_table_has_torchrec_keys_initial_weights_outputs_and_gradients():
    torchrec, plain = _both(n_items=10, d_model=8, time_gap_buckets=5)
    assert (torchrec.backend, plain.backend) == ("torchrec", "torch")
    assert isinstance(plain.collection, PlainEmbeddingCollection)
    state, plain_state = torchrec.state_dict(), plain.state_dict()
    assert list(state) == list(plain_state) == [
        "collection.embeddings.item_table.weight", "collection.embeddings.time_gap_table.weight"
    ]  # fmt: skip
    for key in state:
        assert torch.equal(state[key], plain_state[key]), key  # same seed, same draws
    items = torch.tensor([[3, 7, 10, 0], [9, 0, 0, 0], [1, 2, 0, 0]])
    gaps = torch.tensor([[1, 4, 2, 0], [1, 0, 0, 0], [1, 3, 0, 0]])
    lengths = torch.tensor([3, 1, 2])
    weights = torch.randn(3, 4, 8)
    outputs = []
    for emb in (torchrec, plain):
        out = emb(items, lengths, gaps)  # (B, L, D)
        (out * weights).sum().backward()
        outputs.append((out.detach(), [p.grad for p in emb.parameters()]))
    (out_a, grads_a), (out_b, grads_b) = outputs
    assert torch.equal(out_a, out_b) and float(out_b[0, 3].abs().max()) == 0.0  # padding stays zero
    for grad_a, grad_b in zip(grads_a, grads_b):
        torch.testing.assert_close(grad_a, grad_b, atol=0, rtol=0)
    assert float(grads_b[0][0].abs().max()) == 0.0  # padding positions send nothing to row 0
    torch.testing.assert_close(torchrec.lookup(torch.tensor([4, 0, 4])), plain.lookup(torch.tensor([4, 0, 4])))


def _ranker(backend: str, seed: int) -> AlibiRanker:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=1, dropout=0.0, attention_backend="sdpa",
                      time_gap_buckets=6, embedding_backend=backend)  # fmt: skip
    return AlibiRanker(cfg, n_items=30).eval()


HISTORY, LENGTHS, GAPS = torch.tensor([[3, 4, 5, 9], [7, 2, 0, 0]]), torch.tensor([4, 2]), torch.tensor(
    [[1, 2, 5, 3], [1, 4, 0, 0]]
)


def test_ranker_state_dicts_load_across_backends():
    torchrec, plain = _ranker("torchrec", seed=1), _ranker("torch", seed=2)
    assert not torch.equal(torchrec.score(HISTORY, LENGTHS, GAPS), plain.score(HISTORY, LENGTHS, GAPS))
    plain.load_state_dict(torchrec.state_dict(), strict=True)
    torch.testing.assert_close(plain.score(HISTORY, LENGTHS, GAPS), torchrec.score(HISTORY, LENGTHS, GAPS))
    other = _ranker("torchrec", seed=3)
    other.load_state_dict(plain.state_dict(), strict=True)
    torch.testing.assert_close(other.score(HISTORY, LENGTHS, GAPS), plain.score(HISTORY, LENGTHS, GAPS))


def test_pickle_holds_plain_tables_and_load_rebuilds_the_asked_backend_without_moving_the_rng():
    model = _ranker("auto", seed=4)
    assert model.items.backend == "torchrec"
    blob = pickle.dumps(model)
    assert b"torchrec." not in blob and b"fbgemm" not in blob  # no torchrec class: loads where it is missing
    assert type(model.items.collection).__name__ == "EmbeddingCollection"  # pickling left the model alone
    torch.manual_seed(5)
    restored = pickle.loads(blob)
    assert torch.equal(torch.rand(3), (torch.manual_seed(5), torch.rand(3))[1])  # loading drew nothing
    assert type(restored.items.collection).__name__ == "EmbeddingCollection" and restored.items.backend == "torchrec"
    torch.testing.assert_close(restored.score(HISTORY, LENGTHS, GAPS), model.score(HISTORY, LENGTHS, GAPS))
    restored.items.weight.data[1] += 1.0  # the tied head and the lookup still share one table
    assert torch.equal(restored.items.collection.embeddings["item_table"].weight, restored.items.weight)
    plain = pickle.loads(pickle.dumps(_ranker("torch", seed=4)))
    assert isinstance(plain.items.collection, PlainEmbeddingCollection) and plain.items.backend == "torch"


def test_model_saved_with_torchrec_loads_and_scores_where_torchrec_cannot_be_imported(tmp_path):
    model = _ranker("torchrec", seed=6)
    path = tmp_path / "model.pt"
    torch.save(model, path)  # what mlflow.pytorch's pickle format does
    expected = model.score(HISTORY, LENGTHS, GAPS)
    code = (
        "import sys, json, torch\n"
        "model = torch.load(sys.argv[1], weights_only=False)\n"
        "h, l, g = (torch.tensor(json.loads(a)) for a in sys.argv[2:5])\n"
        "print(json.dumps({'type': type(model.items.collection).__name__, 'backend': model.items.backend,\n"
        "                  'scores': model.score(h, l, g).tolist()}))\n"
    )
    args = [json.dumps(t.tolist()) for t in (HISTORY, LENGTHS, GAPS)]
    got = json.loads(run_without("torchrec,fbgemm_gpu", "-c", code, str(path), *args).stdout.strip().splitlines()[-1])
    assert got["type"] == "PlainEmbeddingCollection" and got["backend"] == "torch"
    torch.testing.assert_close(torch.tensor(got["scores"]), expected)


def test_without_torchrec_auto_is_the_plain_table_torchrec_is_refused_and_imports_stay_lazy():
    code = (
        "import sys\n"
        "import recsys_alibi.model.transformer, recsys_alibi.model.scorer\n"
        "import recsys_alibi.training.module, recsys_alibi.training.losses\n"
        "from recsys_alibi.config import ConfigError, ModelConfig\n"
        "from recsys_alibi.model.embeddings import ItemEmbeddings\n"
        "from recsys_alibi.model.transformer import AlibiRanker\n"
        "print('backend', ItemEmbeddings(5, 4).backend)\n"
        "for kwargs in ({'backend': 'torchrec'}, {'sharded': True}):\n"
        "    try:\n"
        "        ItemEmbeddings(5, 4, **kwargs)\n"
        "    except ConfigError as err:\n"
        "        print('refused', err)\n"
        "heavy = {'torchrec', 'fbgemm_gpu', 'mlflow', 'polars'}\n"
        "print('loaded', sorted({m.split('.')[0] for m in sys.modules} & heavy))\n"
    )
    lines = run_without("torchrec,fbgemm_gpu,mlflow,polars", "-c", code).stdout.strip().splitlines()
    assert lines[0] == "backend torch"
    assert lines[1].startswith("refused model.embedding_backend=torchrec needs torchrec")
    assert "model.embedding_backend=torch" in lines[1]  # the message names the fix
    assert lines[2].startswith("refused model.shard_embeddings=true needs torchrec")
    assert lines[3] == "loaded []"


def test_sharding_needs_the_torchrec_table():
    with pytest.raises(ValueError, match="embedding_backend=torchrec or auto"):
        ModelConfig(shard_embeddings=True, embedding_backend="torch")
    with pytest.raises(ConfigError, match="model.embedding_backend"):
        load_config(overrides=["model.embedding_backend=plain"])
    with pytest.raises(ConfigError, match="expected one of auto, torchrec, torch"):
        resolve_embedding_backend("plain")
    assert resolve_embedding_backend("torch") == "torch" and resolve_embedding_backend("auto") == "torchrec"
    buf = io.BytesIO()
    torch.save(ItemEmbeddings(4, 2, backend="torch").state_dict(), buf)
    assert len(buf.getvalue()) > 0
