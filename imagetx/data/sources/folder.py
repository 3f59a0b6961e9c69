"""A folder of images (``--data.source folder``): every PNG and JPEG under ``--data.root``,
recursively, e.g. CelebA's ``img_align_celeba/`` or your own pictures.

* **Classes**: when every image lies in a sub-folder, the class is the name of its first
  sub-folder (classes numbered in name order); otherwise the folder is unlabelled.
  Names starting with ``.`` (hidden files and folders, the cache below) are skipped.
* **Pictures**: each image is prepared by ``images.prepare_image`` (turned upright, made
  RGB by ``read_picture``'s rules: 16-bit values scaled, transparency laid on white; cropped to
  a square by ``crop``, resized to ``image_size`` by ``resize``), the function that prepares a
  photo for ``imagetx.sample --images`` and the demo, so the same file gives the same pixels.
* **Conversion**: done once, into npz shards of ``SHARD_SIZE`` images in
  ``<cache>/<size>px-<crop>-<resize>/`` (``cache``: ``--data.cache``, default
  ``<root>/.imagetx-cache``), so that training does not decode images every epoch.
  ``manifest.json`` lists the files (path, bytes, modification time) and the options; it
  is written first, then the shards, each atomically, then ``complete.json``. An
  interrupted conversion continues after its last finished shard; a folder that has
  changed since is refused until ``--data.rebuild true`` converts it again. The same
  folder always gives the same shards, byte for byte.
* **Order**: images are ordered by a hash of their path (deterministic, and classes
  mixed), so the held-out split, the last ``val_size`` images, draws from every class.
* Files that cannot be read are skipped, counted, and the first few named.

Pool: ``train`` only (there is no official held-out set; ``val`` is cut from it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ...errors import shown
from ...io.atomic import atomic_write, remove_stale_temporaries
from ..images import CROPS, FILTERS, prepare_image
from .common import Allocate, DataError, Pool, as_given, in_memory, write_npz

SUFFIXES = {".png", ".jpg", ".jpeg"}
SHARD_SIZE = 1000  # images per shard (fewer when some were skipped)
CACHE_NAME = ".imagetx-cache"
# The shards' layout and how their images were prepared; a conversion of another is made again.
# 2: images made RGB by read_picture's rules (1 clipped 16-bit values and dropped transparency).
FORMAT = 2
HELD_OUT = None  # no official held-out set: no test split
SHOWN = 5  # unreadable files named in the warning


def default_val_size(train_images: int) -> int:
    return max(1, min(5000, train_images // 10))  # a tenth of the images, at most 5,000


def scan(root: Path) -> tuple[list[list], list[str]]:
    """([path relative to root, bytes, mtime in ns, label], ...) in conversion order, and the classes."""
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders if not name.startswith(".")]
        for name in names:
            if not name.startswith(".") and Path(name).suffix.lower() in SUFFIXES:
                path = Path(folder) / name
                stat = path.stat()
                files.append([path.relative_to(root).as_posix(), stat.st_size, stat.st_mtime_ns])
    labelled = bool(files) and all("/" in rel for rel, _, _ in files)
    classes = sorted({rel.split("/")[0] for rel, _, _ in files}) if labelled else []
    index = {name: i for i, name in enumerate(classes)}
    files = [[rel, size, mtime, index[rel.split("/")[0]] if labelled else -1] for rel, size, mtime in files]
    files.sort(key=lambda file: (hashlib.blake2b(file[0].encode(), digest_size=8).digest(), file[0]))
    return files, classes


def cache_dir(root: Path, cache: str | os.PathLike | None, image_size: int, crop: str, resize: str) -> Path:
    return Path(cache or root / CACHE_NAME).expanduser() / f"{image_size}px-{crop}-{resize}"


def convert(root: Path, image_size: int = 32, crop: str = "center", resize: str = "area",
            cache: str | os.PathLike | None = None, rebuild: bool = False) -> Path:
    """Convert the folder into shards (or continue, or check an earlier conversion); the shards' folder."""
    if crop not in CROPS or resize not in FILTERS:
        raise DataError(f"--data.crop {crop} / --data.resize {resize}: choose a crop of {', '.join(CROPS)} "
                        f"and a filter of {', '.join(FILTERS)}")
    if not root.is_dir():
        raise DataError(f"--data.root {root} is not a folder: pass the folder that holds your images")
    files, classes = scan(root)
    if not files:
        raise DataError(f"no PNG or JPEG images under {as_given(root)} (searched it and its sub-folders for "
                        f"{', '.join(sorted(SUFFIXES))}): pass the folder that holds them with --data.root")
    out = cache_dir(root, cache, image_size, crop, resize)
    manifest = {"format": FORMAT, "image_size": image_size, "crop": crop, "resize": resize,
                "shard_size": SHARD_SIZE, "classes": classes, "files": files}
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    existing = out / "manifest.json"
    if existing.is_file() and not rebuild and converted_format(existing) != FORMAT:
        print(f"note: {out} was converted by another version of imagetx (images prepared otherwise): "
              "converting again", file=sys.stderr)
        rebuild = True
    if rebuild and existing.is_file():
        shutil.rmtree(out)
    if existing.is_file():
        if existing.read_text() != text:
            raise DataError(f"{root} has changed since it was converted into {out} ({differences(existing, files)}): "
                            f"convert it again with --data.rebuild true (or delete {out})")
        if (out / "complete.json").is_file():
            return out
    else:  # a new conversion: nothing found here before the manifest can be its work
        try:
            out.mkdir(parents=True, exist_ok=True)
            for old in [*out.glob("shard-*.npz"), out / "complete.json"]:
                old.unlink(missing_ok=True)
            write_text(existing, text)
        except OSError as error:
            raise DataError(f"cannot write the converted images to {out} ({error.strerror or error}): choose a "
                            "writable folder with --data.cache DIR") from error
    started = time.time()
    shards = [files[k : k + SHARD_SIZE] for k in range(0, len(files), SHARD_SIZE)]
    todo = [k for k in range(len(shards)) if not shard_path(out, k).is_file()]
    print(f"converting {len(files)} images under {root} to {image_size}x{image_size} ({crop} crop, {resize} filter) "
          f"into {out}" + (f", continuing at shard {todo[0]}" if 0 < len(todo) < len(shards) else ""),
          file=sys.stderr)
    if not classes and any("/" in file[0] for file in files):
        print(f"note: some images lie directly in {root}, others in sub-folders: the folder is read as unlabelled "
              "(put every image in a sub-folder per class for labels)", file=sys.stderr)
    done = len(files) - sum(len(shards[k]) for k in todo)
    with tqdm(total=len(files), initial=done, desc="converting", unit="image", disable=None) as progress:
        for k in todo:
            write_shard(root, out, k, shards[k], image_size, crop, resize)
            progress.update(len(shards[k]))
    skipped = []
    for k in range(len(shards)):
        with np.load(shard_path(out, k)) as shard:
            skipped += [str(reason) for reason in shard["skipped"]]
    write_text(out / "complete.json", json.dumps({"images": len(files) - len(skipped), "skipped": skipped}, indent=1))
    remove_stale_temporaries(out, written_before=started)  # a killed conversion's, not one running beside this
    if skipped:
        listed = "; ".join(shown(reason) for reason in skipped[:SHOWN]) + ("; ..." if len(skipped) > SHOWN else "")
        print(f"warning: skipped {len(skipped)} of {len(files)} image files that could not be read: {listed} "
              f"(all listed in {out / 'complete.json'})", file=sys.stderr)
    return out


def shard_path(out: Path, k: int) -> Path:
    return out / f"shard-{k:05d}.npz"


def write_shard(root: Path, out: Path, k: int, files: list[list], image_size: int, crop: str, resize: str) -> None:
    images, labels, skipped = [], [], []
    for rel, _, _, label in files:
        try:
            # no limit on the bytes of the user's own files: MAX_PIXELS bounds what one decodes to
            images.append(prepare_image(root / rel, image_size, crop, resize, max_bytes=None)[0])
            labels.append(label)
        except Exception as error:  # a damaged file fails in many ways (PIL, zlib, struct...): skip it
            skipped.append(f"{rel} ({type(error).__name__}: {' '.join(str(error).split())[:80]})")
    write_npz(shard_path(out, k), {
        "images": np.stack(images) if images else np.zeros((0, image_size, image_size, 3), np.uint8),
        "labels": np.asarray(labels, dtype=np.int64), "skipped": np.asarray(skipped, dtype=str)})


def converted_format(manifest: Path) -> object:
    """The ``format`` a conversion's manifest names; this ``FORMAT`` where it cannot be parsed,
    so that the manifest is refused below as a changed folder's rather than converted over."""
    try:
        return json.loads(manifest.read_text()).get("format")
    except (ValueError, AttributeError):
        return FORMAT


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda handle: handle.write(text.encode()))


def differences(manifest: Path, files: list[list]) -> str:
    """What changed, in words: counts of files added, removed and changed, and one example."""
    try:
        old = json.loads(manifest.read_text())
        before = {rel: (size, mtime, label) for rel, size, mtime, label in old["files"]}
    except (ValueError, KeyError, TypeError):
        return "its manifest.json is unreadable"
    now = {rel: (size, mtime, label) for rel, size, mtime, label in files}
    added, removed = sorted(now.keys() - before.keys()), sorted(before.keys() - now.keys())
    changed = sorted(rel for rel in now.keys() & before.keys() if now[rel] != before[rel])
    parts = [f"{len(names)} file(s) {what}, e.g. {shown(names[0])}" for names, what in
             ((added, "added"), (removed, "removed"), (changed, "changed")) if names]
    return "; ".join(parts) or "converted with other settings"


def read(root: Path, part: str = "train", image_size: int = 32, crop: str = "center", resize: str = "area",
         cache: str | os.PathLike | None = None, rebuild: bool = False) -> Pool:
    """The folder's images, converted first if need be."""
    root = root.expanduser()
    return read_converted(root, convert(root, image_size, crop, resize, cache, rebuild))


def read_converted(root: Path, out: Path, allocate: Allocate = in_memory) -> Pool:
    """The images of a finished conversion of ``root`` into ``out``."""
    manifest = json.loads((out / "manifest.json").read_text())
    classes = manifest["classes"]
    shards = converted_shards(out)
    # The labels first (small), then each shard's images into their place: the memory of the images
    # and one shard, not twice the images (a concatenation).
    labels = [read_converted_shard(shard, "labels") for shard in shards]
    images = None
    filled = 0
    for shard in shards:
        shard_images = read_converted_shard(shard, "images")
        if images is None:
            images = allocate((sum(map(len, labels)), *shard_images.shape[1:]))
        images[filled : filled + len(shard_images)] = shard_images
        filled += len(shard_images)
    if images is None or not len(images):
        raise DataError(f"none of the image files under {root} could be read (see {out / 'complete.json'}): "
                        "check the files, then convert again with --data.rebuild true")
    where = f"--data.source folder --data.root {root}"
    return Pool(images, np.concatenate(labels) if classes else None, len(classes), where)


def converted_shards(out: Path) -> list[Path]:
    """The shards of the finished conversion in ``out``, in order."""
    count = len(json.loads((out / "manifest.json").read_text())["files"])
    return [shard_path(out, k) for k in range((count + SHARD_SIZE - 1) // SHARD_SIZE)]


def read_converted_shard(shard: Path, name: str) -> np.ndarray:
    try:
        with np.load(shard) as data:
            return data[name]
    except Exception as error:
        raise DataError(f"{shard} is truncated or corrupt ({type(error).__name__}): convert the folder again "
                        "with --data.rebuild true") from error
