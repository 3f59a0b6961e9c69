"""experiments/pixelcnn_log_scales.py: the largest log-scale it reports at step 1 is the largest the
head's own split gives for that batch (the slot it reads is the log-scales', not the means')."""

from __future__ import annotations

import json

import torch

from experiments import pixelcnn_log_scales
from experiments.pixelcnn_pp import batches
from experiments.pixelcnn_pp_model import PixelCNNpp, to_model_input
from experiments.tests.conftest import write_cifar_npz
from imagetx.data.datamodule import ImageDataModule, TrainOrder


def test_step_one_reports_the_heads_largest_log_scale(tmp_path, capsys):
    write_cifar_npz(tmp_path / "data", train_sizes=(12, 8))
    sizes = ["--nr-resnet", "1", "--nr-filters", "8", "--nr-logistic-mix", "3", "--dropout", "0"]
    pixelcnn_log_scales.main(["--data.root", str(tmp_path / "data"), "--val-size", "8", "--steps", "2",
                              "--batch-size", "2", *sizes])
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert [row["step"] for row in rows] == [1, 2] and all(row["finite_gradients"] for row in rows)
    # the same first batch through the same seeded network, split by the head itself
    train = ImageDataModule(root=str(tmp_path / "data"), val_size=8, batch_size=2, download=False, image_size=32,
                            num_classes=0).dataset("train")
    torch.manual_seed(0)
    net = PixelCNNpp(1, 8, 3, 0.0).train()
    images = next(batches(train.images, TrainOrder(train, seed=0), 2))
    with torch.no_grad():
        _, means, log_scales, _ = net.head.split(net(to_model_input(images)))
    assert rows[0]["max_log_scale"] == float(log_scales.max()) != float(means.max())
    assert rows[0]["above_88"] == 0
