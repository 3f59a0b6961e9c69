"""The training stack around the plain network: the LightningModule (``module``), its
optimiser schedule and budget horizon, callbacks, checkpoint writing, throughput, tracking,
resuming and the handling of non-finite steps."""
