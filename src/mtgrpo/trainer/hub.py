"""Uploads to the Hugging Face Hub (TRL's ``push_to_hub`` / ``hub_*`` options).

Everything goes through ``huggingface_hub.HfApi``: the repository is created if needed
(``create_repo(exist_ok=True)``), a branch when ``hub_revision`` names one, and a folder is
uploaded in one commit. ``hub_strategy`` says what is uploaded when (transformers' meaning):

* ``end``: the final model (or LoRA adapter) and tokenizer, when training ends;
* ``every_save``: the model at every checkpoint, and at the end;
* ``checkpoint``: as ``every_save``, plus the newest checkpoint under ``last-checkpoint/``
  (``resume_from_checkpoint`` can use a download of it);
* ``all_checkpoints``: as ``every_save``, plus every checkpoint under its own name.

Uploads are synchronous, so a checkpoint is on the Hub when the save returns.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["HubUploader", "default_repo_id"]


def default_repo_id(output_dir: str | Path, hub_model_id: str | None) -> str:
    """``hub_model_id``, or the output directory's name (the Hub puts it under the token's
    user, as transformers does)."""
    return hub_model_id or Path(output_dir).resolve().name


class HubUploader:
    """Creates the repository once and uploads folders to it."""

    def __init__(self, repo_id: str, *, token: str | None = None, private: bool | None = None,
                 revision: str | None = None) -> None:
        from huggingface_hub import HfApi

        self.api = HfApi(token=token)
        self.revision = revision
        url = self.api.create_repo(repo_id, private=private, exist_ok=True)
        # the Hub's full name: a bare name has gained the token's user as namespace
        self.repo_id = getattr(url, "repo_id", None) or repo_id
        if revision is not None:
            self.api.create_branch(self.repo_id, branch=revision, exist_ok=True)

    def upload(self, folder: str | Path, *, commit_message: str,
               path_in_repo: str | None = None) -> Any:
        """Upload ``folder`` (to ``path_in_repo``, default the repository root)."""
        logger.info("uploading %s to %s/%s", folder, self.repo_id, path_in_repo or "")
        return self.api.upload_folder(
            repo_id=self.repo_id, folder_path=str(folder), path_in_repo=path_in_repo,
            commit_message=commit_message, revision=self.revision,
        )

    def on_save(self, strategy: str, model_dir: Path, checkpoint: Path, step: int) -> None:
        """A checkpoint was written: upload what ``strategy`` asks for."""
        if strategy == "end":
            return
        # transformers' commit message and layout: the repository reads as the HF Trainer's
        self.upload(model_dir, commit_message=f"Training in progress, step {step}")
        if strategy == "checkpoint":
            self.upload(checkpoint, path_in_repo="last-checkpoint",
                        commit_message=f"Checkpoint at step {step}")
        elif strategy == "all_checkpoints":
            self.upload(checkpoint, path_in_repo=checkpoint.name,
                        commit_message=f"Checkpoint at step {step}")
