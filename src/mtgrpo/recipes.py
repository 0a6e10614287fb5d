"""Built-in run recipes (YAML files shipped in ``mtgrpo/configs``, also ``configs/`` in a clone).

``recipe_path("quickstart")`` -> the packaged ``quickstart.yaml``; a path to an existing file is
returned unchanged.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["RECIPES_DIR", "list_recipes", "recipe_path"]

RECIPES_DIR = Path(__file__).parent / "configs"


def list_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def recipe_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    # an existing file wins over a recipe of the same name: a user's edited copy is what runs
    if path.is_file():
        return path
    # only the file name counts: "configs/quickstart.yaml", a clone's path, also names the
    # packaged copy where no clone is
    candidate = RECIPES_DIR / f"{path.name.removesuffix('.yaml')}.yaml"
    if candidate.is_file():
        return candidate
    raise FileNotFoundError(
        f"{name_or_path!r} is neither a config file nor a built-in recipe; recipes: "
        f"{', '.join(list_recipes()) or 'none'}"
    )
