"""The package's layers (docs/model.md, "Where in the code"): the model (``imagetx.model``) is a
leaf: torch and einops (and tqdm for its progress bars), nothing else of imagetx; the files
(``imagetx.io`` and the package's own ``__init__``: loading, saving, Hub sharing) add safetensors
and huggingface_hub; the data layer builds on those, the training stack on the data, the
command lines (``imagetx.cli`` and the ``python -m imagetx.X`` modules) on everything. Below them
all, two modules that any may import, which import nothing of imagetx: ``imagetx.errors`` (the
user-error type) and ``imagetx.compat`` (other libraries' private API, imported inside its
functions). No module imports one of a higher layer, and no two modules import each other, even
through others."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "imagetx"
REPO = PACKAGE.parent
LAYERS = {"model": 0, "io": 1, "data": 2, "training": 3, "cli": 4}  # a top-level module: a command, 4
BASE = {"imagetx.errors", "imagetx.compat"}  # below the model: imported by any layer, importing none
THIRD_PARTY = {0: {"torch", "einops", "tqdm"},  # what each of the two lowest layers may import
               1: {"torch", "einops", "tqdm", "safetensors", "huggingface_hub"}}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    if module in BASE:
        return -1
    parts = module.split(".")
    if len(parts) == 1:
        return LAYERS["io"]  # imagetx/__init__.py: the public API, the model and its files
    return LAYERS.get(parts[1], LAYERS["cli"])


def imports(path: Path, top_level_only: bool) -> tuple[set[str], set[str]]:
    """(imagetx modules, other top-level packages) that the file imports, relative imports
    resolved; with ``top_level_only``, those executed on import (not inside functions)."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    ours, theirs = set(), set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                # ``from . import x`` names modules
                names = [f"{target}.{alias.name}" for alias in node.names] if not node.module else [target]
            else:
                names = [node.module]
        else:
            continue
        for name in names:
            (ours if name.split(".")[0] == "imagetx" else theirs).add(name if name.startswith("imagetx") else
                                                                          name.split(".")[0])
    # ``from package import name``: the module, or (a class, a function) the package's module
    modules = {name if resolves(name) else name.rpartition(".")[0] for name in ours}
    return modules, theirs


def resolves(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def test_no_module_imports_a_higher_layer():
    upward = [f"{module} imports {target}" for module, path in MODULES.items()
              for target in imports(path, top_level_only=False)[0] if layer(target) > layer(module)]
    assert upward == []


def test_the_model_needs_only_torch_and_einops_and_its_files_safetensors_and_huggingface_hub():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    extra = {f"{module} imports {package}" for module, path in MODULES.items() if layer(module) in THIRD_PARTY
             for package in imports(path, top_level_only=False)[1] - stdlib - THIRD_PARTY[layer(module)]}
    assert extra == set()


def test_the_model_imports_nothing_of_imagetx_outside_it():
    outside = {f"{module} imports {target}" for module, path in MODULES.items() if layer(module) == 0
               for target in imports(path, top_level_only=False)[0]
               if not target.startswith("imagetx.model") and target not in BASE}
    assert outside == set()


def test_the_base_modules_import_nothing_of_imagetx_and_no_library_on_import():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for module in BASE:
        ours, theirs = imports(MODULES[module], top_level_only=False)
        assert ours == set(), (module, ours)
        assert imports(MODULES[module], top_level_only=True)[1] <= stdlib, module


def test_no_import_cycles():
    graph = {module: {target for target in imports(path, top_level_only=True)[0] if target in MODULES}
             for module, path in MODULES.items()}
    cycles = []

    def visit(module: str, trail: list[str]) -> None:
        for target in graph[module]:
            if target in trail:
                cycles.append(" -> ".join(trail[trail.index(target):] + [target]))
            elif target not in done:
                visit(target, trail + [target])
        done.add(module)

    done: set[str] = set()
    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    assert cycles == []


def test_the_import_reading_sees_relative_absolute_and_function_level_imports():
    # So that the checks above could fail: what they read of three known modules.
    transformer = imports(MODULES["imagetx.model.transformer"], top_level_only=True)[0]
    assert {"imagetx.model.config", "imagetx.model.attention"} <= transformer
    hub = imports(MODULES["imagetx.io.hub"], top_level_only=True)
    assert "imagetx.model.transformer" in hub[0] and "huggingface_hub" in hub[1]
    assert layer("imagetx.io.hub") > layer("imagetx.model.transformer")
    folder = imports(MODULES["imagetx.data.sources.folder"], top_level_only=True)[0]
    assert {"imagetx.io.atomic", "imagetx.data.images", "imagetx.data.sources.common"} <= folder
    module = imports(MODULES["imagetx.training.module"], top_level_only=False)
    assert "imagetx.model.scoring" in module[0] and "lightning" in module[1]
    assert layer("imagetx.training.module") > layer("imagetx.data.datamodule") > layer("imagetx.model.transformer")


def test_loading_scoring_and_sampling_from_python_never_import_the_training_stack(tmp_path):
    """In a fresh interpreter: import imagetx, open the shipped weights folder and a training-style
    checkpoint, score, sample a few steps; then Lightning, jsonargparse and wandb are not loaded,
    nor torch._dynamo (torch.compile's tracer: ~115 MiB resident, which eager work never needs)."""
    script = textwrap.dedent(f"""
        import sys
        import torch
        import imagetx
        from imagetx import build_model, from_pretrained, load_model
        from imagetx.model.sampler import sample
        from imagetx.model.scoring import evaluate

        model = load_model({str(REPO / "pretrained" / "completion")!r})
        from_pretrained({str(REPO / "pretrained" / "completion")!r})
        tiny = build_model(imagetx.ModelConfig(image_size=4, n_layers=1, d_model=16, d_filter=32,
                                               attention=imagetx.AttentionConfig(n_heads=2, query_block_length=8)))
        checkpoint = {{"imagetx": {{"format": 1, "model_config": tiny.config.to_dict()}},
                      "state_dict": {{"model." + k: v for k, v in tiny.state_dict().items()}}}}
        torch.save(checkpoint, {str(tmp_path / "tiny.ckpt")!r})
        tiny = load_model({str(tmp_path / "tiny.ckpt")!r})
        images = torch.randint(0, 256, (2, 32, 32, 3), dtype=torch.uint8)
        evaluate(model, images, None, progress=False)
        sample(tiny, 2)
        loaded = sorted(name for name in sys.modules
                        if name.split(".")[0] in ("lightning", "jsonargparse", "wandb") or name == "torch._dynamo")
        print("LOADED", loaded)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LOADED []" in done.stdout, done.stdout


def test_the_sampling_scoring_and_export_commands_never_import_lightning_or_torchdata():
    # Their --data.* options are a plain dataclass (data/options.py), not the DataModule's signature.
    script = ("import sys, imagetx.sample, imagetx.evaluate, imagetx.export\n"
              "print('LOADED', sorted({name.split('.')[0] for name in sys.modules} & {'lightning', 'torchdata', "
              "'lightning_fabric', 'pytorch_lightning', 'torchmetrics', 'wandb'}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LOADED []" in done.stdout, done.stdout


def test_the_decoder_imports_neither_flex_attention_nor_compat():
    # FlexAttention is an optional kernel in a module of its own (model/flex.py), imported where it runs: the
    # decoder, built and run on the SDPA path, loads neither it, nor compat.py, nor torch's module (and sympy).
    script = ("import sys, torch, imagetx\nfrom imagetx.model.transformer import ImageTransformer\n"
              "model = ImageTransformer(imagetx.ModelConfig(image_size=4, n_layers=1, d_model=16, d_filter=32,\n"
              "    attention=imagetx.AttentionConfig(n_heads=2, query_block_length=8)), kernel='sdpa')\n"
              "model.bits_per_dim(torch.zeros(1, 4, 4, 3, dtype=torch.uint8))\n"
              "print('LOADED', sorted(name for name in sys.modules if name in ('imagetx.model.flex', 'imagetx.compat',\n"
              "    'torch.nn.attention.flex_attention') or name.split('.')[0] == 'sympy'))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LOADED []" in done.stdout, done.stdout
