"""``imagetx.evaluate --bits_map DIR``: the first images of the split beside the bits each pixel
costs (imagetx.codec.bits_map), as PNGs."""

from __future__ import annotations

import json

import numpy as np
import torch
from PIL import Image

from helpers import tiny_model, write_cifar_npz
from imagetx import save_pretrained
from imagetx.codec.bits_map import MAP_IMAGES, MAP_SCALE, bits_per_pixel, map_picture
from imagetx.evaluate import main


def test_bits_maps_of_the_first_images(tmp_path, capsys):
    model = tiny_model(seed=3, image_size=32, head="categorical", query_block_length=256, num_classes=10)
    save_pretrained(model, tmp_path / "model")
    _, _, images, labels = write_cifar_npz(tmp_path / "data", train_sizes=(3,), test_size=MAP_IMAGES + 2)
    main(["--ckpt", str(tmp_path / "model"), "--data.root", str(tmp_path / "data"), "--split", "test",
          "--device", "cpu", "--bits_map", str(tmp_path / "maps")])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    paths = result["bits_maps"]
    assert len(paths) == MAP_IMAGES and paths[0].endswith("bits_map_00000.png")
    first = np.asarray(Image.open(paths[0]))
    assert first.shape == (32 * MAP_SCALE, 65 * MAP_SCALE, 3)
    # the map is of the image given its label (a conditional model)
    bits = bits_per_pixel(model, torch.from_numpy(images[:1]), torch.from_numpy(labels[:1]).long())
    assert np.array_equal(first, map_picture(images[0], bits[0]))
    assert not np.array_equal(first, map_picture(images[0], bits_per_pixel(model, torch.from_numpy(images[:1]),
                                                                             torch.tensor([(int(labels[0]) + 1) % 10]))[0]))
