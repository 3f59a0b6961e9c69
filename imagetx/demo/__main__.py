"""``python -m imagetx.demo``: the web page of the shipped models on this machine (Gradio).

    python -m imagetx.demo [--host 127.0.0.1] [--port 7860] [--ckpt DIR_OR_CKPT] [--superres-ckpt DIR_OR_CKPT]

Open http://127.0.0.1:7860 in a browser. --ckpt: the model of the complete, generate and compress
tabs (default: pretrained/cifar10_gpu, the README's headline model, else pretrained/completion),
--superres-ckpt: the super-resolution model (default: pretrained/superres_gpu, else
pretrained/superres); each a weights folder (imagetx.export) or a checkpoint written by
imagetx.train. Only this machine can open the page unless --host says otherwise (0.0.0.0: every
network it is on). Needs Gradio: pip install 'imagetx[demo]'. The page runs its models with the
codec's portable arithmetic (docs/compress.md), so that the files its compress tab offers decode on
other machines: the command restarts itself with it.
"""

from __future__ import annotations

import socket
from pathlib import Path

from ..cli.common import parse, parser_for, run_or_exit
from ..cli.shipped import resolve, shipped_folder
from ..codec.arithmetic import restart_with
from ..data.images import MAX_FILE_BYTES
from ..errors import UserError
from ..io.load import load_model
from .tasks import Models, card_bits_per_dim

PRETRAINED = shipped_folder("pretrained")  # the shipped models: the repository's, or the installed package's


def first_shipped(*names: str) -> str:
    """The first of the shipped models ``names`` that is here (the last where none is: the command
    then says it does not exist)."""
    return str(next((PRETRAINED / name for name in names if (PRETRAINED / name).is_dir()), PRETRAINED / names[-1]))


# The page opens on the README's headline models, trained on a GPU, where they are shipped; else on
# the small CPU-trained ones (a wheel built without the GPU models' weights).
DEFAULT_MODEL = first_shipped("cifar10_gpu", "completion")
DEFAULT_SUPERRES = first_shipped("superres_gpu", "superres")
DEFAULT_PORT = 7860  # Gradio's own default, so its documentation's address works
HIGHEST_PORT = 65535
NEEDS_GRADIO = "the demo needs gradio: pip install 'imagetx[demo]'"


def build_parser():
    parser = parser_for(__doc__)
    parser.add_argument("--host", type=str, default="127.0.0.1", help="address to listen on (this machine only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on (1..65535)")
    parser.add_argument("--ckpt", type=str, default=DEFAULT_MODEL,
                        help="completion / generation model: a weights folder or a training checkpoint")
    parser.add_argument("--superres-ckpt", type=str, default=DEFAULT_SUPERRES,
                        help="super-resolution model: a weights folder or a training checkpoint")
    return parser


def load_models(args) -> Models:
    """The two models, each checked to be of its kind; a ValueError of one line otherwise."""
    if not 1 <= args.port <= HIGHEST_PORT:
        raise UserError(f"--port {args.port} is outside 1..{HIGHEST_PORT}: give a free port, e.g. {DEFAULT_PORT}")
    args.ckpt, args.superres_ckpt = resolve(args.ckpt), resolve(args.superres_ckpt)
    for option, path in (("--ckpt", args.ckpt), ("--superres-ckpt", args.superres_ckpt)):
        if not Path(path).exists():
            raise UserError(f"{option} {path} does not exist: give a weights folder (imagetx.export) or a "
                            "checkpoint written by imagetx.train")
    check_port_free(args.host, args.port)  # before the models load: Gradio's own message names an env variable
    completion = load_model(args.ckpt, map_location="cpu")
    superres = load_model(args.superres_ckpt, map_location="cpu")
    if completion.config.superres:
        raise UserError(f"--ckpt {args.ckpt} is a super-resolution model: give it as --superres-ckpt, "
                        "and a model without an encoder as --ckpt")
    if not superres.config.superres:
        raise UserError(f"--superres-ckpt {args.superres_ckpt} is not a super-resolution model (no encoder): "
                        "give one trained with a superres section, e.g. pretrained/superres")
    return Models(completion, superres, shown_path(args.ckpt), shown_path(args.superres_ckpt),
                  card_bits_per_dim(args.ckpt), card_bits_per_dim(args.superres_ckpt))


def check_port_free(host: str, port: int) -> None:
    """A ValueError naming ``--port`` when ``host:port`` cannot be listened on (another program
    has it): bound and let go at once, as the server will bind it (SO_REUSEADDR, as uvicorn)."""
    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as error:
        raise UserError(f"--port {port}: cannot listen on {host}:{port} ({error.strerror or error}); another "
                        f"program may have it: give a free port, e.g. --port {port + 1}, or another --host") from None


def shown_path(path: str) -> str:
    """The path as the page names it: relative to the working directory when inside it
    (pretrained/completion, not the whole absolute path of the default)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return path


def require_gradio() -> None:
    """Gradio importable, or a ValueError saying how to install it."""
    try:
        import gradio  # noqa: F401
    except ModuleNotFoundError as error:
        if error.name != "gradio":
            raise
        raise UserError(NEEDS_GRADIO) from None


def main(argv: list[str] | None = None) -> None:
    args = run_or_exit(lambda: parse(build_parser(), argv, "demo"))
    run_or_exit(require_gradio)  # an optional extra: checked before the models are loaded
    from .page import build

    models = run_or_exit(lambda: load_models(args))
    page = build(models)
    # one sampling job at a time (the CPU is shared); the queue shows the others their place.
    # max_file_size: Gradio refuses a larger upload before it is stored, as read_picture would
    run_or_exit(lambda: page.queue(default_concurrency_limit=1).launch(
        server_name=args.host, server_port=args.port, max_file_size=MAX_FILE_BYTES, ssr_mode=False,
        show_error=True))


def command() -> None:
    """The program (``imagetx-demo``): ``main`` in a process restarted with portable arithmetic."""
    restart_with(True, "imagetx.demo")
    main()


if __name__ == "__main__":
    command()
