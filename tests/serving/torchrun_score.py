"""Run by ``torchrun`` in test_serving_distributed: score with a saved tiny model.

Usage: ``torchrun --standalone --nproc-per-node 2 torchrun_score.py MODEL.pt INPUT OUTPUT``
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving_fixtures import score_config, vocabulary  # noqa: E402

from serving.score import score_with_model  # noqa: E402


def main(argv: list[str]) -> None:
    model_path, input_path, output = argv
    model = torch.load(model_path, weights_only=False)
    result = score_with_model(score_config(), model, vocabulary(), input_path, output, progress=False)
    print(result.summary())


if __name__ == "__main__":
    main(sys.argv[1:])
