"""The commands' files: pictures and npz arrays in (``read_images``), decoded images out
(``write_images``: an npz, one PNG, or a folder of PNGs), every output written whole or not at
all, even when Ctrl-C stops the command (which cli/common.py's ``run_or_exit`` then ends in one
line, exit code 130).

Lossless means the pixels coded are the file's own: a picture is read by ``read_picture`` (limits
on size, the same RGB rules as everywhere else) and coded only where its RGB pixels are exactly
the file's: refused where it has more than 8 bits a sample, several frames, or a conversion that
changes values (CMYK, transparency), and where it is not the model's size (nothing is resized or
cropped). A JPEG is coded as the pixels it decodes to. What each input gave is said in one line.

Each image is named by the file it came from (``Input.names``: a picture its stem, an npz's
k-th image ``STEM_0000k``); a decoded folder's PNGs take the names the compressed file keeps,
where they are safe (names.py), and their index names (``00000.png``, ...) otherwise.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import zipfile
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from ..io.atomic import TEMPORARY_SUFFIX, atomic_write, current_umask, replace_folder
from .container import MAX_IMAGES, Checked, CodecError, read_file
from .names import NPZ_IMAGE_NAME, PNG_NAME, folder_names

NPZ_KEY = "images"  # the array an npz holds its images in (as the CIFAR-10 shards do)
NPZ_SUFFIX, PNG_SUFFIX = ".npz", ".png"
# Picture formats whose samples PIL gives as stored, 8 bits or fewer (fewer: spread exactly over
# 0..255): JPEG, GIF and WebP have no deeper samples and BMP no deeper channels; a PNG's depth is
# read from its header (``png_bit_depth``). PIL reads a 16-bit RGB PNG, TIFF or PPM as 8-bit RGB
# without a word, so formats it cannot be checked for are refused rather than trusted.
EXACT_FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP")
EIGHT_BITS = 8
# The bit depth's offset in a PNG: after the 8-byte signature, IHDR's 4-byte length and 4-byte
# type, and its 4-byte width and height (the PNG specification puts IHDR first).
PNG_DEPTH_OFFSET = 24
# Notes of read_picture (data/images.py) for conversions that keep every value: such a picture is
# coded as the RGB pixels it gives (an upright turn moves pixels, a palette lookup gives the colours
# the file shows). Any other note (an animation's first frame, CMYK converted, 16-bit values
# scaled, transparency laid on white) means the file's own pixels would not come back: refused.
# tests/codec/test_compress_cli.py feeds every kind, so a change of these words fails there.
LOSSLESS_NOTES = ("turned upright", "palette colours looked up")
# Modes made RGB without changing a value (to_rgb spreads grey to three channels, and drops an
# alpha channel that it found opaque everywhere), as the input's line says it.
GREY_MODES = ("1", "L", "LA", "La")
# A compressed file larger than this is not one the codec writes: 100,000 images (MAX_IMAGES) of
# 32×32 at the worst 24 bits a sub-pixel are 0.92 GB. Checked before the file is read.
MAX_COMPRESSED_BYTES = 1_000_000_000


def read_npz(path: Path, size: int) -> np.ndarray:
    try:
        with np.load(path, allow_pickle=False) as archive:
            if NPZ_KEY not in archive.files:
                raise CodecError(f"{path.name} has no array '{NPZ_KEY}' (it has {sorted(archive.files)})")
            images = archive[NPZ_KEY]
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        if isinstance(error, CodecError):
            raise
        raise CodecError(f"{path.name} is not a readable npz file ({type(error).__name__}: {error})") from None
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise CodecError(f"{path.name}: '{NPZ_KEY}' must be (N, H, W, 3) uint8, not {images.dtype} "
                         f"{tuple(images.shape)}")
    check_size(path.name, images.shape[2], images.shape[1], size)
    return images


def png_bit_depth(path: Path) -> int:
    """The bits a sample of a PNG file (1, 2, 4, 8 or 16), from its header."""
    with path.open("rb") as handle:
        header = handle.read(PNG_DEPTH_OFFSET + 1)
    return header[PNG_DEPTH_OFFSET] if len(header) > PNG_DEPTH_OFFSET else 0


def read_picture_exactly(path: Path, size: int) -> tuple[np.ndarray, str]:
    """A picture's pixels, (1, size, size, 3) uint8, exactly the file's, and the line that says
    what was read; a CodecError where the RGB pixels would not be the file's own."""
    # here, not above: data/images.py imports torch, and compress refuses its arguments before that
    from ..data.images import ALPHA_MODES, PictureError, read_picture

    try:
        picture, notes = read_picture(path)
    except PictureError as error:
        raise CodecError(str(error)) from None
    with Image.open(path) as opened:  # read_picture read it whole; this is its header again
        kind, mode = opened.format, opened.mode
    refuse = f"{path.name}: lossless compression codes a file's own pixels"
    if kind not in EXACT_FORMATS:
        raise CodecError(f"{refuse}, and PIL may read a {kind} file's deeper samples as 8 bits without saying: "
                         f"give it as a PNG (pictures taken: {', '.join(EXACT_FORMATS)})")
    depth = png_bit_depth(path) if kind == "PNG" else EIGHT_BITS
    if depth > EIGHT_BITS:
        raise CodecError(f"{refuse}, and its samples are {depth}-bit where the codec codes 8-bit ones: "
                         "cutting them to 8 bits would lose values; convert it to 8-bit first")
    changed = [note for note in notes if not note.startswith(LOSSLESS_NOTES)]
    if changed:
        raise CodecError(f"{refuse}, and reading it as 8-bit RGB would not give them back ({'; '.join(changed)}): "
                         "give one 8-bit RGB or grey picture, e.g. a PNG")
    check_size(path.name, *picture.size, size)
    if mode in GREY_MODES:
        notes.append("grey spread to RGB")
    if mode in ALPHA_MODES:
        notes.append("its alpha channel, opaque everywhere, dropped")
    line = f"{path.name}: {kind} {picture.width}x{picture.height} {mode}"
    if notes:
        line += f", coded as RGB with the same values ({', '.join(notes)})"
    return np.asarray(picture, dtype=np.uint8)[None], line


def check_size(name: str, width: int, height: int, size: int) -> None:
    if (width, height) != (size, size):
        raise CodecError(f"{name} is {width}x{height}; the model codes {size}x{size} images, and lossless "
                         f"compression resizes nothing: crop or resize it to {size}x{size} first")


def input_files(names: list[str]) -> list[Path]:
    """The files the inputs name: a file itself, a folder its pictures and npz files in name order
    (hidden files and other suffixes left out); a CodecError for a path that is neither, or a
    folder with none."""
    files = []
    for name in names:
        path = Path(name)
        if path.is_dir():
            taken = [entry for entry in sorted(path.iterdir()) if entry.is_file() and not entry.name.startswith(".")
                     and entry.suffix.lower() in (NPZ_SUFFIX, *Image.registered_extensions())]
            if not taken:
                raise CodecError(f"input folder {name} holds no pictures or npz files")
            files += taken
        elif path.is_file():
            files.append(path)
        else:
            raise CodecError(f"input {name} does not exist")
    return files


@dataclass
class Input:
    """What one input named on the command line gave: its images, and a line per file read (a
    picture, an npz, or each of a folder's files) saying what that file gave."""

    name: str
    images: np.ndarray
    lines: list[str]
    names: list[str] = field(default_factory=list)  # each image's name: its file's stem (names.py)

    @property
    def one_picture(self) -> bool:
        """A picture named by itself (not a folder, not an npz): said image by image."""
        return len(self.lines) == 1 and len(self.images) == 1 and not self.name.lower().endswith(NPZ_SUFFIX)


def read_images(names: list[str], size: int) -> list[Input]:
    """Every image of the given files and folders (npz: its array ``images``; any other: a
    picture; a folder: ``input_files``), in order, one ``Input`` per name (its images (n, size,
    size, 3) uint8 and one line per file saying what it gave), or a CodecError naming the file and
    the problem."""
    inputs, total = [], 0
    for name in names:
        parts, lines, stems = [], [], []
        for path in input_files([name]):
            if path.stat().st_size == 0:  # said as such: PIL's or numpy's words for it name no cause
                raise CodecError(f"{path.name} is empty (0 bytes): give a picture or an npz file that holds images")
            if path.suffix.lower() == NPZ_SUFFIX:
                images = read_npz(path, size)
                parts.append(images)
                lines.append(f"{path.name}: {len(images)} images {size}x{size} RGB (npz array '{NPZ_KEY}')")
                stems += [NPZ_IMAGE_NAME.format(path.stem, index) for index in range(len(images))]
            else:
                picture, line = read_picture_exactly(path, size)
                parts.append(picture)
                lines.append(line)
                stems.append(path.stem)
            total += len(parts[-1])
            if total > MAX_IMAGES:
                raise CodecError(f"more than {MAX_IMAGES:,} images: a file holds at most that many; "
                                 "compress them in parts")
        inputs.append(Input(name, np.concatenate(parts), lines, stems))
    return inputs


def read_compressed(name: str) -> Checked:
    """The compressed file ``name``, its header and CRC checked, read in pieces (its payload when it
    is decoded: ``container.read_file``), or a CodecError naming it."""
    path = Path(name)
    if path.is_dir():
        raise CodecError(f"{name} is a folder, not a compressed file: give the file imagetx.compress wrote")
    if not path.is_file():
        raise CodecError(f"compressed file {name} does not exist")
    if path.stat().st_size > MAX_COMPRESSED_BYTES:
        raise CodecError(f"{name} is over {MAX_COMPRESSED_BYTES:,} bytes: not a file imagetx.compress writes")
    try:
        return read_file(path)
    except CodecError as error:
        raise CodecError(f"{name}: {error}") from None


def output_kind(out: Path, count: int) -> str:
    """What ``--out`` names for ``count`` decoded images: "npz" (.npz), "png" (.png: one image),
    or "folder" (of PNGs); a CodecError for a .png given several images or another picture suffix
    (decoded images are only ever written losslessly, as PNGs)."""
    suffix = out.suffix.lower()
    if suffix == NPZ_SUFFIX:
        return "npz"
    if suffix == PNG_SUFFIX:
        if count != 1:
            raise CodecError(f"--out {out} names one PNG, but the file holds {count} images: give a folder "
                             f"(PNGs {PNG_NAME.format(0)}, ...) or an .npz")
        return "png"
    if suffix in Image.registered_extensions():
        raise CodecError(f"--out {out}: decoded images are written as PNG (lossless) or npz, not {suffix}: give "
                         f"a .png (one image), a folder or an .npz")
    return "folder"


def foreign_entry(path: Path, writes: Collection[str]) -> str | None:
    """The name of an entry of folder ``path`` that is not a PNG file this decode writes (one of
    ``writes``, its exact file names), or None where there is none. Any other file, an index-named
    PNG of another decode or of the user included, is not this decode's to delete."""
    for entry in sorted(path.iterdir()):
        if entry.is_symlink() or not entry.is_file() or entry.name not in writes:
            return entry.name
    return None


def check_replaceable(path: Path, name: str, force: bool, folder: bool, writes: Collection[str]) -> None:
    """A CodecError unless ``path``, found at --out ``name``, is for ``force`` to replace: a file by a
    file, or by a folder of PNGs a folder holding nothing but the PNGs this decode writes
    (``writes``), so that --force never deletes anything it does not write again."""
    if not force:
        raise CodecError(f"{name} exists: choose another --out, or give --force to replace it")
    if folder and not (path.is_dir() and foreign_entry(path, writes) is None):
        other = f" (it holds {foreign_entry(path, writes)!r})" if path.is_dir() else ""
        raise CodecError(f"{name} is not a folder of decoded PNGs only{other}: --force replaces a folder whole "
                         "where it holds nothing but PNGs this decode writes (the names this file's images take), "
                         "not other files; choose another --out")
    if not folder and path.is_dir():
        raise CodecError(f"{name} is a folder: --force replaces a file, not a folder; choose another --out")


def check_output(name: str, force: bool, folder: bool = False, writes: Collection[str] = ()) -> Path:
    """The output path, checked before any work (``write_images`` checks it again when it writes):
    refused where something is there already that ``force`` may not replace (``check_replaceable``),
    or where its folder does not exist or cannot be written in."""
    path = Path(name)
    if path.exists() or path.is_symlink():
        check_replaceable(path, name, force, folder, writes)
    parent = path.absolute().parent
    if not parent.exists():  # a mistyped path is not made into folders
        raise CodecError(f"cannot write {name}: the folder {parent} does not exist; create it first")
    try:
        if not parent.is_dir():
            raise NotADirectoryError(f"{parent} is a file, not a folder")
        with tempfile.TemporaryFile(dir=parent):  # unnamed where the system allows: nothing to clean up
            pass
    except OSError as error:
        raise OSError(f"cannot write {name}: {error.strerror or error}; choose another --out") from None
    return path


@contextmanager
def writing(out: Path) -> Iterator[None]:
    """A failed write as one line naming the user's path, not the temporary file it went to."""
    try:
        yield
    except OSError as error:
        raise OSError(f"cannot write {out}: {error.strerror or error}; nothing was written") from None


def write_file(out: Path, data: bytes) -> None:
    """``data`` to ``out`` whole or not at all (``atomic_write``); errors name ``out``."""
    with writing(out):
        atomic_write(out, lambda handle: handle.write(data))


def npz_bytes(images: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **{NPZ_KEY: images})
    return buffer.getvalue()


def png_bytes(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def write_images(images: np.ndarray, out: Path, names: Sequence[str] = (), force: bool = False) -> list[Path]:
    """(N, H, W, 3) uint8 -> ``out`` as ``output_kind`` says: an npz (array ``images``), one PNG,
    or a folder of PNGs, each named as ``names`` (a stem an image, as a file keeps them) says
    where that name is safe (names.py), else 00000.png, 00001.png, ... by its place in the file.
    What is at ``out`` is judged again as it is replaced (``check_replaceable``: a decode may take
    hours, and the user may save a file there meanwhile): only with ``force``, and a folder only
    where it holds nothing but the PNGs written now. A folder is written whole beside ``out``,
    then takes its place (``replace_folder``): an earlier decode there is replaced, never mixed
    with. A failed, refused or interrupted write leaves ``out`` as it was and nothing beside it."""
    kind = output_kind(out, len(images))
    written = folder_names(names, len(images))[0] if kind == "folder" else []

    def judge(found: Path) -> None:
        try:
            check_replaceable(found, str(out), force, kind == "folder", written)
        except CodecError as error:
            raise CodecError(f"{error} (as found once decoded; nothing was written)") from None

    if kind != "folder":
        if out.exists() or out.is_symlink():
            judge(out)
        write_file(out, npz_bytes(images) if kind == "npz" else png_bytes(images[0]))
        return [out]
    with writing(out):
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=TEMPORARY_SUFFIX, dir=out.parent))
        try:
            os.chmod(staging, 0o777 & ~current_umask())  # mkdtemp makes 0700 folders; give the usual permissions
            for name, image in zip(written, images):
                if Path(name).name != name or name.startswith("."):  # folder_names gives none such: a guard
                    raise CodecError(f"{name!r} is not a plain file name")
                data = png_bytes(image)
                atomic_write(staging / name, lambda handle, data=data: handle.write(data))
            replace_folder(staging, out, judge)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return [out / name for name in written]
