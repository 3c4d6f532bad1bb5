"""Training with the plain ``nn.Embedding`` item table where torchrec cannot be imported.

The same tiny model and seed trained once with torchrec (in this process) and once in a
subprocess where torchrec and fbgemm-gpu are hidden from the import system
(``tests/without_modules.py``) must follow the same losses step by step, to round-off, and the
checkpoints must load into either backend.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from fit_tiny import fit
from training_fixtures import tiny_config, write_walks
from without_modules import run_without

from recsys_alibi.training.module import RankerModule

HERE = Path(__file__).resolve().parent


def run_without_torchrec(script: Path, *args: str) -> dict:
    """``python script args`` with torchrec and fbgemm_gpu hidden; its ``RESULT {json}`` line."""
    code = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    done = run_without("torchrec,fbgemm_gpu", "-c", code, str(script), *args)
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def _module(config, backend: str) -> RankerModule:
    model_cfg = config.model.model_copy(update={"embedding_backend": backend})
    return RankerModule(model_cfg, config.train, n_items=40)


def test_same_seed_trains_to_the_same_losses_with_torchrec_and_the_plain_table(tmp_path):
    prepared = write_walks(tmp_path / "prepared")
    plain = run_without_torchrec(HERE / "fit_tiny.py", str(prepared), str(tmp_path / "plain"), "auto")
    torchrec = fit(prepared, tmp_path / "torchrec", "auto")
    assert (plain["backend"], torchrec["backend"]) == ("torch", "torchrec")  # auto picks what imports
    assert len(plain["losses"]) == len(torchrec["losses"]) >= 9  # 3 epochs of 240 users in batches of 32
    torch.testing.assert_close(torch.tensor(plain["losses"]), torch.tensor(torchrec["losses"]), rtol=1e-5, atol=1e-6)
    assert abs(plain["best_val_ndcg_at_10"] - torchrec["best_val_ndcg_at_10"]) < 1e-4

    # the plain run's checkpoint loads into a torchrec model, the torchrec one into a plain model
    config = tiny_config(tmp_path)
    weights = {}
    for name, run, backend in (("plain", plain, "torchrec"), ("torchrec", torchrec, "torch")):
        module = _module(config, backend).eval()
        state = torch.load(run["best_checkpoint"], map_location="cpu", weights_only=False)["state_dict"]
        module.load_state_dict(state, strict=True)
        assert module.model.items.backend == backend
        weights[name] = module.model.score(torch.tensor([[3, 4, 5, 6]]), torch.tensor([4]))
    torch.testing.assert_close(weights["plain"], weights["torchrec"], rtol=1e-4, atol=1e-5)
