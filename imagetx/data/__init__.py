"""Data: where images come from (``sources``: CIFAR-10, downsampled ImageNet, a folder), and
the Lightning DataModule that feeds training (``datamodule``)."""
