"""The demo's Gradio page: three tabs wired to ``tasks.Models``. Uploads are ``gr.File``
inputs, not ``gr.Image`` ones: an image input decodes (and re-encodes) the file in Gradio's own
code, where a bad picture would fail with Gradio's error instead of ``read_picture``'s reason.
Every element a test drives has an ``elem_id``."""

from __future__ import annotations

import gradio as gr

from ..data.images import MAX_FILE_BYTES, megabytes
from .compress_tab import add_tab as add_compress_tab
from .tasks import SUPERRES_TEMPERATURES, Models, examples

# the sliders' ranges: at least one row kept and one left to draw; up to 8 samples, about 10 s
# of sampling on a 2-core CPU for half an image; temperatures past 1.5 give noise
MAX_SAMPLES = 8
DEFAULT_SAMPLES = 4
MAX_TEMPERATURE = 1.5
TEMPERATURE_STEP = 0.05
GALLERY_COLUMNS = 4  # four 256-pixel samples in a row fit a laptop screen
IMAGE_HEIGHT = 300  # pixels: a 256-pixel picture (tasks.SCALE) with the box's label and border
GALLERY_HEIGHT = 400  # pixels: two rows of four samples (MAX_SAMPLES) at a laptop's width, no empty space

def intro(models: Models) -> str:
    """The page's first words: which models answer (the GPU-trained ones by default, the small
    CPU-trained ones with ``--ckpt``), what to expect of them, and what happens to an upload."""
    return f"""# imagetx: the Image Transformer on 32×32 pictures
Serving `{models.completion_path}` (val bits/dim {models.completion_bpd}) to complete and generate, and
`{models.superres_path}` ({models.superres_bpd} given the 8×8 input) to upsample. Trained for minutes to
hours, not the paper's days: they carry colours, textures and layout into plausible regions, and few
samples show an object you could name. An upload is centre-cropped and area-resized to 32×32 first;
the page says what was done. One sampling job runs at a time: others wait in the queue, their place shown."""


def class_choice(model) -> gr.Dropdown:
    """A class dropdown, shown only for a class-conditional model (its value is ignored otherwise)."""
    classes = model.config.num_classes
    return gr.Dropdown([(f"class {i}", i) for i in range(max(classes, 1))], value=0, label="class",
                       visible=bool(classes))


def sliders(prefix: str, count: int = DEFAULT_SAMPLES) -> tuple:
    """(samples, temperature, seed) inputs."""
    samples = gr.Slider(1, MAX_SAMPLES, value=count, step=1, label="samples", elem_id=f"{prefix}-count")
    temperature = gr.Slider(0, MAX_TEMPERATURE, value=1.0, step=TEMPERATURE_STEP,
                            label="temperature (0: the most likely value)", elem_id=f"{prefix}-temperature")
    seed = gr.Number(0, precision=0, minimum=0, label="seed", elem_id=f"{prefix}-seed")
    return samples, temperature, seed


def upload_box(prefix: str) -> gr.File:
    box = gr.File(label=f"your picture (any size, up to {megabytes(MAX_FILE_BYTES)})", file_types=["image"],
                  type="filepath", elem_id=f"{prefix}-upload")
    gr.Examples([[path] for path in examples()], inputs=box, label="or pick an example (CIFAR-10 val images)")
    return box


def shown_image(label: str, elem_id: str) -> gr.Image:
    return gr.Image(label=label, type="pil", format="png", interactive=False, buttons=["download"],
                    height=IMAGE_HEIGHT, elem_id=elem_id)


def samples_gallery(elem_id: str) -> gr.Gallery:
    # fit_columns=False: one sample stays sample-sized instead of filling the row
    return gr.Gallery(label="samples", format="png", columns=GALLERY_COLUMNS, object_fit="contain",
                      fit_columns=False, height=GALLERY_HEIGHT, interactive=False, elem_id=elem_id)


def downloads(elem_id: str) -> gr.File:
    return gr.File(label="the samples as PNG files", file_count="multiple", interactive=False, elem_id=elem_id)


def build(models: Models) -> gr.Blocks:
    size = models.completion.config.image_size
    with gr.Blocks(title="imagetx demo", analytics_enabled=False) as page:
        gr.Markdown(intro(models))
        with gr.Tab("complete", id="complete"):
            with gr.Row():
                with gr.Column(scale=1):
                    upload = upload_box("complete")
                    rows = gr.Slider(1, size - 1, value=size // 2, step=1, label="rows to keep",
                                     elem_id="complete-rows")
                    count, temperature, seed = sliders("complete")
                    label = class_choice(models.completion)
                    run = gr.Button("complete", variant="primary", elem_id="complete-run")
                with gr.Column(scale=2):
                    status = gr.Markdown(elem_id="complete-status")
                    with gr.Row():
                        original = shown_image("your picture at 32×32", "complete-original")
                        kept = shown_image("the part kept (the rest grey)", "complete-kept")
                    samples = samples_gallery("complete-samples")
                    files = downloads("complete-files")
            run.click(models.complete, [upload, rows, count, temperature, seed, label],
                      [original, kept, samples, files, status])
        with gr.Tab("super-resolution", id="superres"):
            with gr.Row():
                with gr.Column(scale=1):
                    upload = upload_box("superres")
                    seed = gr.Number(0, precision=0, minimum=0, label="seed", elem_id="superres-seed")
                    label = class_choice(models.superres)
                    run = gr.Button("upsample", variant="primary", elem_id="superres-run")
                with gr.Column(scale=2):
                    status = gr.Markdown(elem_id="superres-status")
                    temperatures = " / ".join(map(str, SUPERRES_TEMPERATURES))
                    gr.Markdown(f"Samples at temperatures {temperatures}, given the picture's 8×8 average.")
                    with gr.Row():
                        small = shown_image("the 8×8 input", "superres-input")
                        original = shown_image("your picture at 32×32", "superres-original")
                    samples = samples_gallery("superres-samples")
                    files = downloads("superres-files")
            run.click(models.upsample, [upload, seed, label], [small, samples, original, files, status])
        with gr.Tab("generate", id="generate"):
            with gr.Row():
                with gr.Column(scale=1):
                    count, temperature, seed = sliders("generate")
                    label = class_choice(models.completion)
                    run = gr.Button("generate", variant="primary", elem_id="generate-run")
                with gr.Column(scale=2):
                    status = gr.Markdown(elem_id="generate-status")
                    samples = samples_gallery("generate-samples")
                    files = downloads("generate-files")
            run.click(models.generate, [count, temperature, seed, label], [samples, files, status])
        add_compress_tab(models, IMAGE_HEIGHT, upload_box)
    return page
