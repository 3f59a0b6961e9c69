"""``python -m imagetx.demo``: a local web page (Gradio) for trying the shipped models.

    pip install -e '.[demo]'
    python -m imagetx.demo [--host 127.0.0.1] [--port 7860] [--ckpt pretrained/completion]
                           [--superres-ckpt pretrained/superres]

Three tabs: complete (your photo's top rows kept, the model draws the rest, growing row by row),
super-resolution (your picture's 8×8 version in, 32×32 samples out) and generate (from scratch,
per class for a class-conditional model). The page says what was done to an upload, the model's
val bits/dim (from its model card) and how long sampling took.

Parts: ``tasks`` (what the page runs: no Gradio, so tests call it directly), ``page`` (the
Gradio layout) and ``__main__`` (the command line). Importing this package imports neither
Gradio nor a model.
"""
