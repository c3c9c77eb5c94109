"""SAE-V training, encoding, saving and loading: ordinary sae-lens SAEs (TopK, Standard, JumpReLU).

`sae_lens` is imported lazily (it takes seconds to import), only where an SAE is built or loaded.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch

from analysis.sae_v.codec import Codec, as_codec
from analysis.sae_v.params import TrainParams
from analysis.sae_v.types import META_FILE, Progress, SaeMeta, _noop


def _batches(acts: torch.Tensor, batch_size: int, total_steps: int, progress: Progress,
             generator: torch.Generator) -> Iterator[torch.Tensor]:
    """The trainer's data provider: an endless stream of shuffled batches that reports progress."""
    served = 0
    while True:
        order = torch.randperm(acts.shape[0], generator=generator)
        for start in range(0, acts.shape[0] - batch_size + 1, batch_size):
            served += 1
            if served % 25 == 0:
                progress(min(served / max(total_steps, 1), 1.0), f"SAE step {min(served, total_steps)}/{total_steps}")
            yield acts[order[start:start + batch_size]]


def train_sae(acts: torch.Tensor, params: TrainParams, progress: Progress | None = None):
    """Train an sae-lens SAE on residual vectors (N, d); returns the inference SAE."""
    import contextlib
    import io
    import tempfile

    from sae_lens import SAE, SAETrainer
    from sae_lens.config import LoggingConfig, SAETrainerConfig
    from sae_lens.saes.sae import TrainingSAE

    progress = progress or _noop
    sae_type = params.sae_type()  # an unknown architecture or a bad setting: SettingsError
    batch_size = min(params.batch_size, acts.shape[0])
    torch.manual_seed(params.seed)
    generator = torch.Generator().manual_seed(params.seed)
    sae_cfg = sae_type.training_config(acts.shape[1], params.d_sae, params.steps)
    training_sae = TrainingSAE.from_dict(sae_cfg.to_dict())
    trainer_cfg = SAETrainerConfig(
        total_training_samples=params.steps * batch_size, train_batch_size_samples=batch_size,
        lr=params.lr, lr_end=params.lr / 10, lr_scheduler_name="cosineannealing",
        lr_warm_up_steps=params.steps // 20, lr_decay_steps=params.steps // 5,
        dead_feature_window=max(params.steps // 4, 50), feature_sampling_window=max(params.steps, 1),
        n_batches_for_norm_estimate=20, logger=LoggingConfig(log_to_wandb=False),
    )
    provider = _batches(acts.float(), batch_size, params.steps, progress, generator)
    trainer = SAETrainer(cfg=trainer_cfg, sae=training_sae, data_provider=provider)
    with contextlib.redirect_stderr(io.StringIO()):  # the trainer's tqdm bar; analysis never prints
        trained = trainer.fit()
    with tempfile.TemporaryDirectory() as tmp:
        trained.save_inference_model(tmp)
        sae = SAE.load_from_disk(tmp)
    progress(1.0, "SAE trained")
    return sae.eval()


def encode(sae, acts: torch.Tensor) -> torch.Tensor:
    """The codes of residual vectors (N, d_in) under any SAE (a Codec, or a sae-lens SAE made one)."""
    return as_codec(sae).encode(acts)


def reconstruction_metrics(sae, acts: torch.Tensor, threshold: float = 0.0) -> tuple[float, float, int]:
    """(fraction of variance explained, mean L0, features never active) on `acts`."""
    codes, recon = as_codec(sae).reconstruct(acts)
    resid = ((acts - recon) ** 2).sum()
    total = ((acts - acts.mean(0)) ** 2).sum()
    active = codes > threshold
    return float(1 - resid / total), float(active.sum(1).float().mean()), int((~active.any(0)).sum())


def save_sae(sae, meta: SaeMeta, folder: str | Path) -> Path:
    """sae-lens layout (cfg.json + sae_weights.safetensors) plus our metadata. The cfg names the hook it
    reads, so sae-lens (and this panel's outside-SAE loader) can use it too; its inputs are scaled per
    modality (meta.scales), which only our metadata records."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if meta.hook_name and getattr(sae.cfg.metadata, "hook_name", None) is None:
        sae.cfg.metadata.hook_name = meta.hook_name
    sae.save_model(folder)
    (folder / META_FILE).write_text(meta.to_json(indent=1))
    return folder


def load_sae(folder: str | Path) -> tuple[Codec, SaeMeta]:
    """(SAE as a Codec, SaeMeta) from a folder written by `save_sae`."""
    from sae_lens import SAE

    folder = Path(folder)
    if not (folder / "cfg.json").is_file():
        raise FileNotFoundError(f"No SAE in '{folder}'.")
    sae = SAE.load_from_disk(folder).eval()
    meta = SaeMeta.from_json((folder / META_FILE).read_text())
    return as_codec(sae), meta


